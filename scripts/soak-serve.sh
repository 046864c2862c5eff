#!/usr/bin/env bash
# A serve left alone: `gpusweep serve --demo` of N simulated hosts, no client, its resident memory, threads
# and CPU printed every minute for MINUTES, to see whether anything grows.
#   scripts/soak-serve.sh N MINUTES
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?hosts}; MIN=${2:?minutes}
source scripts/lib/host.sh
start_demo_serve "$N"
trap 'kill $P 2>/dev/null; rm -rf "$D"' EXIT
until curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; do sleep 0.2; done
tck=$(getconf CLK_TCK)
c_prev=$(awk '{print $14+$15}' "/proc/$P/stat")
for m in $(seq 0 "$MIN"); do
  [ "$m" -gt 0 ] && sleep 60
  c=$(awk '{print $14+$15}' "/proc/$P/stat")
  awk -v m="$m" -v rss="$(awk '/VmRSS/{print $2}' "/proc/$P/status")" -v th="$(awk '/^Threads:/{print $2}' "/proc/$P/status")" \
    -v c0="$c_prev" -v c1="$c" -v tck="$tck" -v first="$m" \
    'BEGIN { cpu = first == 0 ? "-" : sprintf("%.1f%%", 100*(c1-c0)/tck/60); printf "minute %2d: %6.1f MB resident, %d threads, CPU over the last minute %s\n", m, rss/1024, th, cpu }'
  c_prev=$c
done
