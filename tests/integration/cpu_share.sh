# A CPU-share check with its control (sourced after lib.sh, not run): a
# daemon that should sleep is measured beside a busy loop pinned to the same
# CPUs, over the same window. A spinning daemon takes about as much as the
# loop beside it, however loaded the machine is (a starved spinner and a
# starved loop starve together); a sleeping one takes a small fraction.

# ticks PID: user + system CPU time of PID so far, in clock ticks
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null; }

# cpu_vs_busy PID SECS: prints "DAEMON_TICKS BUSY_TICKS CPUS": what PID and
# a busy loop pinned to PID's CPUs each used over the same SECS.
cpu_vs_busy() {
  local cpus bp d0 b0 d1 b1
  cpus=$(taskset -cp "$1" 2>/dev/null | sed 's/.*: *//')
  taskset -c "${cpus:-0}" bash -c 'while :; do :; done' & bp=$!
  sleep 0.2  # the loop is running before the window opens
  d0=$(ticks "$1"); b0=$(ticks "$bp")
  sleep "$2"
  d1=$(ticks "$1"); b1=$(ticks "$bp")
  kill "$bp"; wait "$bp" 2>/dev/null
  echo "$((${d1:-0} - ${d0:-0})) $((${b1:-0} - ${b0:-0})) ${cpus:-?}"
}

# sleeps_beside DAEMON_TICKS BUSY_TICKS: true when the daemon took under a
# fifth of what the loop took, and the loop got at least 20 ticks (0.2 s
# of CPU at 100 ticks a second), so the comparison means something.
sleeps_beside() { [ "$2" -ge 20 ] && [ $(($1 * 5)) -lt "$2" ]; }
