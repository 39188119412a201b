# Readiness probes for the integration scripts and tools/*.sh that start a
# server and then its client: each waits for the thing the client needs (a
# listening TCP port, a socket file, a line of output), looking at most a
# fixed number of times, never for a fixed time. Each returns 1 when it
# gave up, so the caller fails (or says why) instead of racing. Sourced
# after lib.sh, not run.

# probe TRIES COMMAND...: runs COMMAND until it succeeds, at most TRIES
# times, 0.05 s apart. PROBES is how many looks the last probe took.
probe() {
  local tries=$1; shift
  PROBES=0
  while [ "$PROBES" -lt "$tries" ]; do
    PROBES=$((PROBES + 1))
    "$@" && return 0
    sleep 0.05
  done
  return 1
}

# listening NS PID PORT: process PID ("" = any) listens on TCP PORT in
# namespace NS ("" = here).
listening() {
  local out
  if [ -n "$1" ]; then out=$(ip netns exec "$1" ss -Hltnp "sport = :$3" 2>/dev/null); else out=$(ss -Hltnp "sport = :$3" 2>/dev/null); fi
  [ -z "$2" ] && [ -n "$out" ] && return 0
  case "$out" in *"pid=$2,"*) return 0 ;; esac
  return 1
}
# sockets PATH...: every PATH is a Unix socket.
sockets() { local p; for p in "$@"; do [ -S "$p" ] || return 1; done; }
# has_line FILE REGEX: FILE has a line matching REGEX.
has_line() { grep -qE "$2" "$1" 2>/dev/null; }

# wait_listen NS PID PORT: up to 400 looks (a server that starts DPDK
# first takes a while under load).
wait_listen() { probe 400 listening "$@"; }
wait_sockets() { probe 400 sockets "$@"; }
wait_line() { probe 400 has_line "$@"; }
