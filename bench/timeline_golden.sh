#!/usr/bin/env bash
# The timeline benchmarks at their smallest settings that still exercise every event kind and
# every defragmenter (4 policies with and without defrag; all 8 defragmenters under 2 policies;
# 6 h measured after 2 h warm-up, seed 42). `bench/timeline_golden.sh record` writes
# bench/golden/timeline/* (OUT=DIR: elsewhere); with no argument it runs the same commands into a
# temporary folder and diffs them against the golden files (wall times and memory are stripped
# first: only results are compared). The golden files were recorded before the timeline became
# a class and its node sums were tracked (issues 23 and 26), the peers' files again at 20fbf78 with
# their ports made faithful (issue 25) on the old timeline, and again in session 9 for the rows
# that reserve-binpack's tie-break and make-room's patience under a packing scheduler change
# (every row scheduled by reserve-binpack or fgd with defrag; issue 25); the full-size tables the docs quote
# are compared with the docs themselves (docs/benchmarks.md § Simulator speed). ~12 min on the
# shared 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mode=${1:-check}
golden=bench/golden/timeline
out=${OUT:-$golden}  # record: OUT=DIR writes elsewhere
if [ "$mode" != record ]; then out=$(mktemp -d); fi
mkdir -p "$out"
strip() {  # drop wall times, memory, the per-run seconds and the command (its --out): results only
  grep -v -E '^\(?[0-9.]+ s per run|s per run on average|^wall |^Command: ' "$1" \
    | sed -E 's/"seconds": [0-9.]+/"seconds": 0/' > "$1.tmp" && mv "$1.tmp" "$1"
}
$PY -m bench.bench_timeline --policies reserve-binpack,least-allocated,best-fit,fgd --seeds 1 \
  --hours 6 --warmup 2 --defrag --jobs 1 --out "$out/bench_timeline_6h.md" > /dev/null
$PY -m bench.bench_peers --seeds 1 --hours 6 --warmup 2 --jobs 1 \
  --out "$out/bench_peers_6h.md" --json "$out/bench_peers_6h.json" > /dev/null
for f in "$out"/*.md "$out"/*.json; do strip "$f"; done
if [ "$mode" != record ]; then
  diff -r "$golden" "$out" && echo "timeline goldens: identical"
fi
