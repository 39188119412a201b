#!/bin/sh
# A short libFuzzer run of one target (CI runs each briefly; tools/fuzz.sh
# runs them long).
#   run_fuzz.sh FUZZER SECONDS [SEED_DIR | GEN_FRAMES]
# The seeds: a directory of inputs, or gen_frames, which writes frames.
set -eu
fuzzer=$1; secs=$2; seeds=${3:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/corpus" "$dir/out"
if [ -d "$seeds" ]; then
  cp "$seeds"/* "$dir/corpus/"
elif [ -n "$seeds" ]; then
  "$seeds" --count 400 --v6-count 100 --seed 5 --out "$dir/out" --corpus "$dir/corpus"
fi
exec "$fuzzer" -max_total_time="$secs" -max_len=9000 -print_final_stats=1 "$dir/corpus"
