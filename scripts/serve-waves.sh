#!/usr/bin/env bash
# A serve's memory across waves of event streams: `gpusweep serve --demo` of N simulated hosts, then WAVES
# waves of C `curl -N /api/v1/events` clients, each open 8 s, then all gone 7 s (the serve looks every 5 s
# whether streams ended and gives memory back). Resident MB at idle, with the wave open, and after it left.
#   scripts/serve-waves.sh [N] [C] [WAVES]      (defaults 1000 100 4)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; C=${2:-100}; WAVES=${3:-4}
source scripts/lib/host.sh
start_demo_serve "$N"
CURLS=()
trap 'kill "${CURLS[@]}" $P 2>/dev/null; rm -rf "$D"' EXIT
until curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; do sleep 0.2; done
sleep 3
rss() { awk '/VmRSS/{printf "%.0f", $2/1024}' "/proc/$P/status"; }
line="idle $(rss) MB"
for w in $(seq 1 "$WAVES"); do
  CURLS=()
  for _ in $(seq 1 "$C"); do curl -sN "http://127.0.0.1:$PORT/api/v1/events" >/dev/null 2>&1 & CURLS+=($!); done
  sleep 8
  open=$(rss)
  kill "${CURLS[@]}" 2>/dev/null || true
  wait "${CURLS[@]}" 2>/dev/null || true
  sleep 7
  line="$line · wave $w open $open / gone $(rss) MB"
done
echo "$N hosts, $C streams a wave: $line"
