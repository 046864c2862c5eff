#!/usr/bin/env bash
# No verdict passes through clean, on a real GPU: the crash an operator lives, RUNS times. A serve watches;
# ep_launcher.py starts four PyTorch ranks on GPU 0; once they hold their memory rank 2 is SIGKILLed, then
# the launcher (`kill -9`, the launcher alone, as `pkill -f` on sglang's name ends only its launcher), and
# with it the lost rank's zombie is reaped by init while the three other ranks, orphans now, hold theirs. From the rank's kill until the job is swept, `gpusweep
# check` is asked through the serve every 0.1 s, and nvidia-smi's memory.used of GPU 0 beside each answer.
# Expected: no check says 0 (ok) while nvidia-smi reads memory held. Writes $OUT/flicker.log and
# $OUT/flicker-RUN.tsv (ms since the rank's kill, check's exit, MiB used).
#   RUNS=10 OUT=$OUT BIN=.gpu/gpusweep scripts/gpu-flicker.sh
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}
OUT=${OUT:-/tmp/gpusweep-flicker}
RUNS=${RUNS:-10}
source scripts/lib/gpu-log.sh flicker
export PYTHONUNBUFFERED=1 GPUSWEEP_AUDIT_LOG=$W/actions.jsonl GPUSWEEP_CONFIG=/nonexistent/gpusweep.toml
SRV=""
trap 'pkill -9 -f ep_launcher.py 2>/dev/null; [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$W"' EXIT
wait_for() { for _ in $(seq 1 "$3"); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.5; done; return 1; }
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' '; }

say "gpu-flicker: $RUNS runs ($(date -u +%FT%TZ)); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0)"
"$BIN" serve --listen 127.0.0.1:19402 --no-socket --interval 250ms 2>"$W/serve.err" &
SRV=$!
for _ in $(seq 1 40); do curl -sf http://127.0.0.1:19402/healthz >/dev/null && break; sleep 0.25; done
false_ok=0
for run in $(seq 1 "$RUNS"); do
  tsv=$OUT/flicker-$run.tsv
  : >"$tsv"
  setsid -f python3 scripts/gpu/ep_launcher.py --workers 4 --gpus 1 --gb 4 --steps 8 --step-s 1 \
    --ready-dir "$W/ready$run" >"$W/out$run" 2>&1
  # Every rank holding its memory, the launcher asleep (it reaps no rank then, as a server's launcher
  # waiting on its ranks' collective does not): a killed rank stays its zombie until the launcher goes.
  wait_for "ALL READY" "$W/out$run" 240 || { res "run $run: FAIL ranks not ready"; cat "$W/out$run" >>"$L"; continue; }
  LP=$(sed -n 's/^LAUNCHER \([0-9]*\) WORKERS .*/\1/p' "$W/out$run")
  R2=$(sed -n 's/^LAUNCHER [0-9]* WORKERS //p' "$W/out$run" | cut -d, -f3)
  t0=$(date +%s%3N)
  kill -9 "$R2"
  # The gate, asked through the node's serve at 10 Hz until the job is swept.
  (
    while [ ! -e "$W/stop$run" ]; do
      "$BIN" check --hosts http://127.0.0.1:19402 >/dev/null 2>&1
      rc=$?
      echo "$(( $(date +%s%3N) - t0 ))	$rc	$(used)" >>"$tsv"
      sleep 0.1
    done
  ) &
  POLL=$!
  sleep 2
  # The ritual, on the launcher alone (its ranks' command lines name the script too: a pkill -f would end
  # them with it, where sglang's multiprocessing ranks survive it).
  kill -9 "$LP"
  tk=$(( $(date +%s%3N) - t0 ))
  sleep 8
  "$BIN" sweep --yes --grace 5s >"$W/sweep$run" 2>&1
  sleep 1
  touch "$W/stop$run"
  wait "$POLL" 2>/dev/null
  n=$(wc -l <"$tsv")
  bad=$(awk -F'\t' '$2 == 0 && $3 > 0' "$tsv" | wc -l)
  false_ok=$((false_ok + bad))
  res "run $run: rank $R2 killed at 0 ms, launcher $LP at $tk ms; $n checks, $bad said ok while GPU 0 held memory; exits: $(cut -f2 "$tsv" | sort | uniq -c | tr '\n' ' ')"
  pkill -9 -f ep_launcher.py 2>/dev/null
  for _ in $(seq 1 40); do [ "$(used)" = 0 ] && break; sleep 0.5; done
done
res "RESULT: $false_ok check(s) said ok while nvidia-smi read GPU 0 held, over $RUNS run(s)"
[ "$false_ok" = 0 ]
