#!/usr/bin/env bash
# A job's warm-up and a lost rank on a real GPU, under `gpusweep run --fail-fast`: four PyTorch ranks on GPU 0
# load 6 GiB each in six steps, rank 2 at a quarter of the pace (a straggler); once the job reads settled,
# rank 1 is SIGKILLed while the launcher and the other ranks live on (as when one rank dies in warm-up and the
# rest wait in a collective). Expected: the status lines say starting/loading/settled with the warm-up's
# length; the events name the straggler and the lost rank; run ends the rest at once and exits 3; GPU 0
# reads zero. Writes $OUT/jobs.log, $OUT/events.jsonl, $OUT/run.err, $OUT/snapshot.json.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}
OUT=${OUT:-/tmp/gpusweep-jobs}
source scripts/lib/gpu-log.sh jobs
export PYTHONUNBUFFERED=1 GPUSWEEP_AUDIT_LOG=$OUT/actions.jsonl GPUSWEEP_CONFIG=$W/config.toml
printf '[jobs]\nsettle = "4s"\nstraggler = "2s"\n' >"$GPUSWEEP_CONFIG"
trap 'pkill -9 -f ep_launcher.py 2>/dev/null; rm -rf "$W"' EXIT
wait_for() { for _ in $(seq 1 "$3"); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.5; done; return 1; }

say "gpusweep run --fail-fast -- ep_launcher.py --workers 4 --gpus 1 --gb 6 --steps 6 --step-s 1 --slow 2 ($(date -u +%FT%TZ))"
"$BIN" run --fail-fast --interval 250ms --grace 5s --timeout 60s --events "$OUT/events.jsonl" -- \
  python3 scripts/gpu/ep_launcher.py --workers 4 --gpus 1 --gb 6 --steps 6 --step-s 1 --slow 2 \
  >"$W/out" 2>"$OUT/run.err" &
SUP=$!
wait_for "ALL READY" "$W/out" 240 || { res "FAIL: the ranks did not get ready"; cat "$W/out" "$OUT/run.err" >>"$L"; exit 1; }
WP=$(sed -n 's/^LAUNCHER [0-9]* WORKERS //p' "$W/out")
res "workers $WP"
wait_for "settled at" "$OUT/run.err" 60 || res "FAIL: no settled line"
"$BIN" snapshot --json >"$OUT/snapshot.json" 2>&1
"$BIN" snapshot 2>&1 | sed -n '/JOBS/,/^$/p' >>"$L"
LOST=$(echo "$WP" | cut -d, -f2)
KILL_MS=$(date +%s%3N)
say "kill -9 $LOST (rank 1) at $(date -u +%T.%N | cut -c1-12)"
kill -9 "$LOST"
wait "$SUP"; RC=$?
cat "$OUT/run.err" >>"$L"
left=0; for p in ${WP//,/ }; do [ -e /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status && left=$((left+1)); done
MEM=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
res "run exited $RC; ranks left running: $left; nvidia-smi memory.used now: $MEM MiB"
ok() { if eval "$2"; then res "PASS $1"; else res "FAIL $1"; fi; }
ok "exit 3 (--fail-fast, lost rank)" '[ "$RC" = 3 ]'
# Starting lasts until the ranks' first CUDA context: whether a poll falls in it is a race, so it is noted, not
# required; loading (the rise seen) and the settled warm-up are.
grep -q "starting:" "$OUT/run.err" && res "NOTE starting was said" || res "NOTE starting was not said (over before the first poll)"
ok "phases said: loading (never holding, not seen rising), settled with its warm-up" 'grep -q "loading " "$OUT/run.err" && ! grep -q "not seen rising" "$OUT/run.err" && grep -q "warm-up" "$OUT/run.err"'
ok "straggler named (rank 2)" 'grep "\"kind\":\"straggler\"" "$OUT/events.jsonl" | grep -q "\"pid\":$(echo "$WP" | cut -d, -f3)"'
ok "rank_lost event names rank 1" 'grep "\"event\":\"rank_lost\"" "$OUT/events.jsonl" | grep -q "\"pid\":$LOST"'
# Ranks starting CUDA hold GPU 0 a moment before NVML lists them, and ranks being killed are charged until
# the driver frees their memory: neither is a leak, and an exiting rank is no "reused" PID.
ok "no leak said while the ranks started and loaded" "python3 -c 'import json,sys; sys.exit(any(e.get(\"event\")==\"finding_appeared\" and e.get(\"severity\")==\"leak\" and e[\"at_ms\"]<$KILL_MS for e in map(json.loads, open(\"$OUT/events.jsonl\"))))'"
ok "no ghost called a reused PID" '! grep -q "the PID was reused" "$OUT/events.jsonl"'
ok "no rank left, GPU 0 reads zero" '[ "$left" = 0 ] && [ "$MEM" = 0 ]'
grep -E '"event":"(job_started|job_phase|rank_lost|job_ended)"' "$OUT/events.jsonl" >>"$L"

# Scene 2, watched by a serve: the job's helpers (a data-loader rank 1 forks once its GPU is open, a sidecar
# opening /dev/nvidia0), rank 2 killed mid-warm-up, then the launcher killed (the ritual). Expected: one job
# throughout (its ranks are not split into a job each when reparented), 4 ranks and 2 helpers, the lost rank
# still named with the launcher said gone; `sweep --job` ends every rank and helper; GPU 0 reads zero.
# Writes $OUT/scene2.json (the serve's jobs at each step).
say "scene 2: serve; setsid ep_launcher.py --workers 4 --gpus 1 --gb 4 --steps 8 --loader 1 --sidecar 0 ($(date -u +%FT%TZ))"
"$BIN" serve --listen 127.0.0.1:19401 --no-socket --interval 250ms 2>"$W/serve.err" &
SRV=$!
trap 'pkill -9 -f ep_launcher.py 2>/dev/null; kill $SRV 2>/dev/null; rm -rf "$W"' EXIT
setsid -f python3 scripts/gpu/ep_launcher.py --workers 4 --gpus 1 --gb 4 --steps 8 --step-s 1 --loader 1 \
  --sidecar 0 --ready-dir "$W/ready2" >"$W/out2" 2>&1
wait_for "SIDECAR" "$W/out2" 60 || { res "FAIL: no launcher"; cat "$W/out2" >>"$L"; exit 1; }
LP=$(sed -n 's/^LAUNCHER \([0-9]*\) WORKERS .*/\1/p' "$W/out2")
WP2=$(sed -n 's/^LAUNCHER [0-9]* WORKERS //p' "$W/out2")
SIDE=$(sed -n 's/^SIDECAR //p' "$W/out2")
jobs_now() {
  python3 - "$LP" <<'PY'
import json, sys, urllib.request
try:
    v = json.load(urllib.request.urlopen("http://127.0.0.1:19401/api/v1/snapshot", timeout=5))
except Exception as e:
    print(json.dumps({"error": str(e)})); sys.exit(0)
jobs = v["hosts"][0].get("jobs", [])
print(json.dumps({"jobs": jobs, "mine": [j for j in jobs if j["id"] == "tree:" + sys.argv[1]]}))
PY
}
until_job() { for i in $(seq 1 "$2"); do [ -n "${FULL:-}" ] && [ "$i" -le 12 ] && { curl -s http://127.0.0.1:19401/api/v1/snapshot; echo; } >>"$OUT/scene2-full.jsonl"; J=$(jobs_now); echo "$J" >>"$OUT/scene2.json"; python3 -c "import json,sys; j=json.loads(sys.argv[1]); m=j.get('mine') or [{}]; m=m[0]; sys.exit(0 if ($1) else 1)" "$J" && return 0; sleep 0.5; done; return 1; }
: >"$OUT/scene2.json"
res "launcher $LP workers $WP2 sidecar $SIDE"
ok "4 ranks and 2 helpers (the data-loader, the sidecar) while loading" 'until_job "len(m.get(\"ranks\",[]))==4 and len(m.get(\"helpers\",[]))==2" 120'
R2=$(echo "$WP2" | cut -d, -f3)
say "kill -9 $R2 (rank 2) mid-warm-up; then kill -9 $LP (the launcher)"
kill -9 "$R2"
# The serve's whole readings around the kill (the first twelve), to tell why a loss is missed if it is.
FULL=1 ok "rank 2 lost" 'until_job "any(l[\"pid\"]==$R2 for l in m.get(\"lost\",[]))" 40'
kill -9 "$LP"
ok "one job still, its launcher said gone, rank 2 still named lost" 'until_job "m.get(\"launcher_gone_ms\") and any(l[\"pid\"]==$R2 for l in m.get(\"lost\",[])) and len(j[\"jobs\"])==1" 40'
"$BIN" sweep --job "tree:$LP" --yes --grace 5s >"$W/sweep2" 2>&1; SRC=$?
cat "$W/sweep2" >>"$L"
# Ranks, the data-loader (rank 1's child, the same command line) and the sidecar.
left2=0; for p in $(pgrep -f ep_launcher.py) $SIDE; do [ -e /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status && left2=$((left2+1)); done
MEM2=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
ok "sweep --job tree:$LP ended every rank and helper (exit $SRC, $left2 left), GPU 0 reads zero ($MEM2 MiB)" '[ "$SRC" = 0 ] && [ "$left2" = 0 ] && [ "$MEM2" = 0 ]'
kill "$SRV" 2>/dev/null
