#!/bin/sh
# Runs an oracle script on frames freshly built by gen_frames.
#   with_frames.sh GEN_FRAMES PYTHON SCRIPT [gen_frames args...]
set -eu
gen=$1; py=$2; script=$3; shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$gen" --out "$dir" "$@"
exec "$py" "$script" "$dir"
