#!/bin/sh
# The committed fixtures are exactly what make_fixtures writes today.
#   fixtures_reproducible.sh MAKE_FIXTURES FIXTURE_DIR
set -u
gen=$1; dir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bad"
"$gen" "$tmp" || { echo "0 passed, 1 failed"; exit 1; }
pass=0; fail=0
for f in $(cd "$tmp" && find . -name '*.pcap' | sort); do
  if cmp -s "$tmp/$f" "$dir/$f"; then pass=$((pass+1)); else echo "FAIL: $f differs from a fresh make_fixtures run"; fail=$((fail+1)); fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
