#!/bin/sh
# A short libFuzzer run of the parser, seeded with frames from gen_frames.
#   run_fuzz.sh FUZZER GEN_FRAMES SECONDS
set -eu
fuzzer=$1; gen=$2; secs=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/corpus" "$dir/out"
"$gen" --count 400 --v6-count 100 --seed 5 --out "$dir/out" --corpus "$dir/corpus"
exec "$fuzzer" -max_total_time="$secs" -max_len=9000 -print_final_stats=1 "$dir/corpus"
