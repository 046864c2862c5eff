#!/usr/bin/env bash
# CPU of `gpusweep wait` and `gpusweep serve` at a 100 ms poll on a node with N processes (default 5000
# sleepers), one of them holding a GPU, with a GPU that stays in use so neither ever finishes. Without an
# NVIDIA driver the file-driven stand-in NVML (tests/fixtures/standin_nvml.c) plays it; on a GPU host set
# REAL_GPU=1 and hold a GPU yourself. CHURN=1 also starts a short-lived process every second (a node where
# processes come and go; without it, /proc is listed only when a PID was handed out).
#   scripts/bench-busy-node.sh [N] [SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-5000}; SECS=${2:-20}
source scripts/lib/host.sh
D=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; pkill -P $$ sleep 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
export GPUSWEEP_CONFIG=$D/none.toml GPUSWEEP_SOCKET=$D/serve.sock
EXTRA=()
if [ -z "${REAL_GPU:-}" ]; then
  cc -shared -fPIC -o "$D/libnvidia-ml.so.1" tests/fixtures/standin_nvml.c
  : >"$D/nvidia0"
  sleep 100000 <"$D/nvidia0" & PIDS+=($!)
  echo "1024 $!:1024" >"$D/nvml"
  export GPUSWEEP_NVML_LIBRARY=$D/libnvidia-ml.so.1 STANDIN_NVML_STATE=$D/nvml
  EXTRA=(--device-glob "$D/nvidia*")
fi
for _ in $(seq 1 "$N"); do sleep 100000 & done
if [ -n "${CHURN:-}" ]; then (while :; do /bin/true; sleep 1; done) & PIDS+=($!); fi
sleep 1
echo "processes on this host: $(ls /proc | grep -c '^[0-9]')"
cpu() { # PID SECS -> percent of one core
  local c0 c1; c0=$(awk '{print $14+$15}' "/proc/$1/stat"); sleep "$2"; c1=$(awk '{print $14+$15}' "/proc/$1/stat")
  awk -v a="$c0" -v b="$c1" -v t="$(getconf CLK_TCK)" -v s="$2" 'BEGIN { printf "%.2f", 100*(b-a)/t/s }'
}
"$BIN" wait --no-serve --poll 100ms --timeout "$((SECS + 30))s" "${EXTRA[@]}" >/dev/null 2>&1 & W=$!; PIDS+=($W)
sleep 3
echo "wait --poll 100ms, $N processes: $(cpu "$W" "$SECS")% of one core over $SECS s"
kill "$W" 2>/dev/null || true
"$BIN" serve --no-http --interval 100ms "${EXTRA[@]}" 2>/dev/null & S=$!; PIDS+=($S)
sleep 3
echo "serve --interval 100ms, $N processes: $(cpu "$S" "$SECS")% of one core over $SECS s"
