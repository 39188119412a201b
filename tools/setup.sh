#!/usr/bin/env bash
# uroce setup: installs the Debian packages the project needs (idempotent),
# builds, and runs a job.
#
#   tools/setup.sh demo    install, build, run the main job (two daemons, verified RC traffic)
#   tools/setup.sh test    install, build (plain and ASan/UBSan), run every test suite
#   tools/setup.sh build   install and build only
#   tools/setup.sh bench   install, build, run the side-by-side benchmark suite (root; writes bench-out/)
#
# Environment: UROCE_BUILD (default: build), UROCE_ASAN_BUILD (default: build-asan),
# UROCE_SKIP_INSTALL=1 to skip apt.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
build=${UROCE_BUILD:-build}
asan_build=${UROCE_ASAN_BUILD:-build-asan}

packages=(
  dpdk-dev libdpdk-dev libibverbs-dev librdmacm-dev libgtest-dev googletest libgmock-dev libbenchmark-dev
  libboost-dev libboost-program-options-dev libpcap-dev nlohmann-json3-dev meson ninja-build python3-scapy tshark zlib1g-dev libisal-dev pkg-config libsystemd-dev
  g++ clang libclang-rt-14-dev valgrind nftables iproute2 gnuplot-nox bc
  busybox-static cpio zstd qemu-system-x86
  ibverbs-utils perftest rdmacm-utils ucx-utils libucx-dev openmpi-bin libopenmpi-dev python3-pyverbs libfabric-bin qperf
  prometheus python3-prometheus-client
  debhelper help2man dpkg-dev fakeroot
)

log() { printf '== %s\n' "$*"; }

install_packages() {
  [ "${UROCE_SKIP_INSTALL:-0}" = 1 ] && return 0
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "packages: all ${#packages[@]} present"
    return 0
  fi
  log "packages: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # tshark asks whether non-root users may capture; answer no, non-interactively.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

configure() {  # dir, extra meson args...
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

build_plain() {
  log "build: $build (gcc, debugoptimized)"
  configure "$build"
  ninja -C "$build"
}

build_asan() {
  # clang so that the same sanitized build also carries the libFuzzer target.
  log "build: $asan_build (clang, ASan + UBSan, fuzz targets)"
  CC=clang CXX=clang++ configure "$asan_build" -Db_sanitize=address,undefined -Db_lundef=false \
    -Dfuzz=true -Dbench=disabled -Dbuildtype=debug -Doptimization=1
  ninja -C "$asan_build"
}

run_demo() {
  # The main job: two daemons over a virtual link doing verified RC traffic.
  log "demo: two uroced over net_memif, verified RC traffic"
  tools/demo.sh "$build"
}

# suite LOGNAME BUILD MESON-TEST-ARGS...: one `meson test` run with its own
# log (BUILD/meson-logs/LOGNAME.{txt,json}; each run used to overwrite the
# last one's testlog), then every skip it had, checked against the
# allow-list in tools/check_skips.py: a skip not on it fails the run.
suite() {
  local name=$1 dir=$2; shift 2
  local rc=0
  meson test -C "$dir" --logbase "$name" --print-errorlogs "$@" || rc=$?
  log "log of this suite: $dir/meson-logs/$name.txt"
  /usr/bin/python3 tools/check_skips.py "$dir/meson-logs/$name.json" || rc=1
  return $rc
}

run_tests() {
  log "tests: unit + conformance + integration (plain build)"
  suite unit-conformance-integration "$build" --suite unit --suite conformance --suite integration
  log "tests: rdma-core's own verbs test suite (python3-pyverbs), daemon and embedded mode"
  suite rdma-core "$build" --suite rdma-core
  grep -hE '^(== (daemon|embedded) mode|rdma-core suite:|  skips:|  of the )' "$build/meson-logs/rdma-core.txt" || true
  log "tests: interop with Linux rxe in a QEMU guest (a skip is allowed only where QEMU cannot run at all)"
  suite interop "$build" --suite interop
  # How often the interop suite's end-of-run rules and reruns fired (meson shows no stdout for a pass).
  grep -hE '^(RETRY_EXC_ERR end-of-run rule fired|perftest clock-calibration reruns|rping 44 exit races)' \
    "$build/meson-logs/interop.txt" || true
  log "demo (the README's first command, on the same build)"
  tools/demo.sh "$build" 5000
  log "tests: unit + conformance + fuzz (ASan/UBSan build)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    suite asan-unit-conformance-fuzz "$asan_build" --suite unit --suite conformance --suite fuzz
  log "logs: $build/meson-logs/{unit-conformance-integration,rdma-core,interop}.txt, $asan_build/meson-logs/asan-unit-conformance-fuzz.txt"
}

case "${1:-}" in
  demo) install_packages; build_plain; run_demo ;;
  test) install_packages; build_plain; build_asan; run_tests ;;
  build) install_packages; build_plain ;;
  bench) install_packages; build_plain; tools/bench/suite.sh "$build" "${2:-bench-out}" ;;
  *) echo "usage: tools/setup.sh demo|test|build|bench" >&2; exit 2 ;;
esac
