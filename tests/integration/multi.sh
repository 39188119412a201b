#!/bin/bash
# One daemon with several pipelines: (1) one port sharded over two lcores,
# the app's QP on shard 1 so its traffic crosses the dispatcher's ring and
# the TX funnel; (2) two ports on one daemon, the app on the second.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ready.sh"
need_root
run() {  # tag server-args... -- client-args...
  local tag=$1; shift
  local sx=() cx=() side=s
  for a in "$@"; do if [ "$a" = "--" ]; then side=c; elif [ $side = s ]; then sx+=("$a"); else cx+=("$a"); fi; done
  start_traffic "" "srv-$tag" --role server --idle-max-us 50 "${sx[@]}"
  local spid=$LAST_PID
  wait_listen "" "$spid" 18515 || bad "$tag: the server listens on TCP 18515 (gave up after $PROBES looks)"
  start_traffic "" "cli-$tag" --role client --peer 127.0.0.1 --messages 1500 --idle-max-us 50 "${cx[@]}"
  local cpid=$LAST_PID
  wait "$cpid"; local crc=$?; wait "$spid"; local src=$?
  echo "  client: $(cat "$TMP/cli-$tag.out")"
  check "$tag: client verified all traffic" "[ $crc -eq 0 ] && grep -q 'uroce-traffic: OK' '$TMP/cli-$tag.out'"
  check "$tag: server verified every SEND" "[ $src -eq 0 ] && grep -q ', 0 bad' '$TMP/srv-$tag.out'"
}

echo "== one port, two shards (lcores 0 and 1), the app's QP on shard 1"
run sharded --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/a.sock" --ip 10.92.0.1 \
  --shards 2 --lcores 0,1 --pipeline 1 \
  -- --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/a.sock" --ip 10.92.0.2 --lcore 1
st=$(grep -o 'status=.*' "$TMP/srv-sharded.err" | sed 's/^status=//')
roce1=$(jget "$st" dataplane_1.rx_roce)
qps0=$(jget "$st" pipeline.qps); qps1=$(jget "$st" pipeline_1.qps)
drops=$(jget "$st" ethdev.dispatch_drops)
echo "  shard 1 received $roce1 RoCE frames through the dispatcher; QPs on shards: $qps0/$qps1; ring drops $drops"
check "sharded: the QP lives on shard 1 and its frames reached it" "[ $qps1 -eq 1 ] && [ $qps0 -eq 0 ] && [ $roce1 -gt 1500 ]"
check "sharded: no dispatch or funnel drops" "[ $drops -eq 0 ]"

echo "== two ports on one daemon, the app on the second"
run twoport --port net_memif0 --vdev "net_memif0,role=server,socket=$TMP/b0.sock" --ip 10.93.0.1 \
  --port net_memif1 --vdev "net_memif1,role=server,socket=$TMP/b1.sock" --ip 10.93.1.1 --lcores 0,1 --pipeline 1 \
  -- --port net_memif0 --vdev "net_memif0,role=client,socket=$TMP/b1.sock" --ip 10.93.1.2 --lcore 1
st=$(grep -o 'status=.*' "$TMP/srv-twoport.err" | sed 's/^status=//')
check "twoport: two ports, each with its own address" "[ '$(jget "$st" pipeline_1.ip)' = 10.93.1.1 ] && [ '$(jget "$st" pipeline.ip)' = 10.93.0.1 ]"
check "twoport: the second port carried the traffic" "[ $(jget "$st" dataplane_1.rx_roce) -gt 1500 ]"

echo "== configuration errors are clear"
"$UROCED" --no-huge --port net_memif0 --port net_memif1 --ip 10.0.0.1 > "$TMP/e1" 2>&1; e1=$?
check "one --ip per --port is enforced" "[ $e1 -eq 2 ] && grep -q 'one --ip per --port' '$TMP/e1'"
"$UROCED" --no-huge --port net_memif0 --ip 10.0.0.1 --shards 2 --lcores 0 > "$TMP/e2" 2>&1; e2=$?
check "lcores must match ports x shards" "[ $e2 -eq 2 ] && grep -q 'need 2 lcores' '$TMP/e2'"
"$UROCED" --no-huge --port net_memif0 --ip 10.0.0.999 > "$TMP/e3" 2>&1; e3=$?
check "a bad address is named" "[ $e3 -eq 2 ] && grep -q \"got '10.0.0.999'\" '$TMP/e3'"
"$UROCED" --no-huge --port net_memif0 --ip 10.0.0.1 --fault-rx drop=7 > "$TMP/e4" 2>&1; e4=$?
check "a bad fault spec is refused at start" "[ $e4 -eq 2 ] && grep -q 'fault-rx' '$TMP/e4'"
printf 'port = net_memif0\nip = 10.0.0.1\ndscp = 99\n' > "$TMP/bad.conf"
"$UROCED" --no-huge --config "$TMP/bad.conf" > "$TMP/e5" 2>&1; e5=$?
check "a bad value in the config file is refused" "[ $e5 -eq 2 ] && grep -q 'dscp must be' '$TMP/e5'"
"$UROCED" --no-huge --port net_memif0 --ip 10.0.0.1 --link-mtu 100 > "$TMP/e9" 2>&1; e9=$?
check "a link MTU out of range is refused" "[ $e9 -eq 2 ] && grep -q 'link-mtu must be 576..9600' '$TMP/e9'"
printf 'port = net_memif0\nip = 10.0.0.1\nrole = client\npeer = 127.0.0.1\nmtu = 1000\n' > "$TMP/bad2.conf"
"$UROCE_TRAFFIC" --no-huge --config "$TMP/bad2.conf" > "$TMP/e6" 2>&1; e6=$?
check "uroce-traffic's own keys are checked in the same config file" "[ $e6 -eq 2 ] && grep -q 'mtu must be' '$TMP/e6'"
"$UROCED" --no-huge --port net_memif0 --ip 10.0.0.1 --role server > "$TMP/e7" 2>&1; e7=$?
check "uroced has no built-in traffic: --role is unknown to it" "[ $e7 -eq 2 ] && grep -q 'role' '$TMP/e7'"
"$UROCE_TRAFFIC" --no-huge --port net_memif0 --ip 10.0.0.1 --role client > "$TMP/e8" 2>&1; e8=$?
check "uroce-traffic: a client needs --peer" "[ $e8 -eq 2 ] && grep -q 'needs --peer' '$TMP/e8'"
finish
