#!/usr/bin/env bash
# The whole suite N times in a row (default 3), each from a fresh clone of HEAD, while one CPU hog per core
# (`yes > /dev/null`) keeps the machine busy; the hogs are stopped when it ends, however it ends.
# Prints one line per run: its exit code, wall time, the load average before and after, and its log, kept
# under .bkaudit/stress/ of this checkout (the clones are removed).
#   tests/stress/suite_under_load.sh [N]
set -uo pipefail
runs="${1:-3}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
logs="$repo/.bkaudit/stress"
mkdir -p "$logs"
hogs=()
stop_hogs() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done; }
trap stop_hogs EXIT
for _ in $(seq "$(nproc)"); do yes > /dev/null & hogs+=("$!"); done
failed=0
for run in $(seq "$runs"); do
  clone="$(mktemp -d /tmp/bkaudit-stress.XXXX)"
  git clone -q "$repo" "$clone"
  log="$logs/$(date +%Y%m%d-%H%M%S)-$(git -C "$clone" rev-parse --short HEAD)-run$run.log"
  before="$(cut -d' ' -f1-3 /proc/loadavg)"
  started=$(date +%s)
  (cd "$clone" && CI=true bash .ci/run > "$log" 2>&1)
  code=$?
  after="$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "run $run: exit $code in $(( $(date +%s) - started )) s, load $before -> $after, log $log ($(grep -E '[0-9]+ (passed|failed)' "$log" | tail -1))"
  [ "$code" -eq 0 ] || failed=1
  rm -rf "$clone"
done
exit "$failed"
