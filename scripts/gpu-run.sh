#!/usr/bin/env bash
# `gpusweep run` on a real GPU: an EP-style launcher with several PyTorch workers run as a job, then
#  A. the launcher alone SIGKILLed (not gpusweep): every worker must end and the GPU read zero, with the time;
#  B. `pkill -9 -f ep_launcher` (which matches the launcher and its workers): the supervisor, whose command
#     line holds nothing of the command, survives and reports the GPU clean.
# Writes $OUT/run.log.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}
OUT=${OUT:-/tmp/gpusweep-run}
WORKERS=${WORKERS:-4}; GB=${GB:-8}
export PYTHONUNBUFFERED=1 GPUSWEEP_CONFIG=${GPUSWEEP_CONFIG:-/nonexistent/gpusweep.toml}
export GPUSWEEP_AUDIT_LOG=$OUT/actions.jsonl
source scripts/lib/gpu-log.sh run
trap 'pkill -9 -f ep_launcher.py 2>/dev/null; rm -rf "$W"' EXIT
ready() { for _ in $(seq 1 120); do grep -q "ALL READY" "$1" && return 0; sleep 0.5; done; return 1; }

for scene in A B; do
  say "scene $scene: gpusweep run -- python3 scripts/gpu/ep_launcher.py --workers $WORKERS --gpus 1 --gb $GB ($(date -u +%FT%TZ))"
  "$BIN" run --timeout 60s -- python3 scripts/gpu/ep_launcher.py --workers "$WORKERS" --gpus 1 --gb "$GB" \
    >"$W/out.$scene" 2>"$W/err.$scene" &
  SUP=$!
  ready "$W/out.$scene" || { res "FAIL $scene: workers did not get ready"; cat "$W/out.$scene" "$W/err.$scene" >>"$L"; continue; }
  LP=$(sed -n 's/^LAUNCHER \([0-9]*\) WORKERS.*/\1/p' "$W/out.$scene")
  WP=$(sed -n 's/^LAUNCHER [0-9]* WORKERS //p' "$W/out.$scene")
  res "supervisor $SUP cmdline: $(tr '\0' ' ' </proc/$SUP/cmdline)"
  res "launcher $LP workers $WP"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$L"
  "$BIN" snapshot 2>&1 | sed -n '/PID USER/,/^$/p' >>"$L"
  if [ "$scene" = A ]; then
    say "kill -9 $LP (the launcher only)"
    kill -9 "$LP"
  else
    say "pkill -9 -f ep_launcher"
    pkill -9 -f ep_launcher
    sleep 0.2
    if kill -0 "$SUP" 2>/dev/null; then res "PASS B: the supervisor survived pkill -f"; else res "FAIL B: the supervisor died"; fi
  fi
  wait "$SUP"; RC=$?
  cat "$W/err.$scene" >>"$L"
  res "run exited $RC"
  left=0; for p in ${WP//,/ }; do [ -e /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status && left=$((left+1)); done
  MEM=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  res "workers left running: $left; nvidia-smi memory.used now: $MEM MiB"
  if [ "$left" = 0 ] && [ "$MEM" = 0 ] && grep -q "read zero" "$W/err.$scene"; then
    res "PASS $scene: $(grep -o 'read zero .*' "$W/err.$scene")"
  else
    res "FAIL $scene"
    # What the GPU reads now, for the record: the state and findings that kept it from clean.
    "$BIN" snapshot --json >"$OUT/after-$scene.json" 2>&1
  fi
done
