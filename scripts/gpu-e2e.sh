#!/usr/bin/env bash
# End-to-end validation on a real NVIDIA GPU host with PyTorch (written for one H200; works with more GPUs).
# Makes real leaks with PyTorch and checks what gpusweep finds, that sweeps bring the GPU back to 0 MiB, the
# TUI under tmux, the agent path, and the speed numbers. Results go to $OUT (default /tmp/gpusweep-e2e):
#   summary.txt  PASS/FAIL per check and the key numbers     e2e.log   everything, step by step
#   tui.txt      TUI screens captured under tmux             bench.txt whole-process timings, poll bench, TUI CPU
#   ep.log       the EP-style job killed and swept (gpu-ep.sh)   forkleak.json / actions.jsonl
# Usage: BIN=.gpu/gpusweep scripts/gpu-e2e.sh      (BENCH=.gpu/poll-bench for the in-process poll benchmark)
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu/gpusweep}
BENCH=${BENCH:-.gpu/poll-bench}
OUT=${OUT:-/tmp/gpusweep-e2e}
G=scripts/gpu
mkdir -p "$OUT"
W=$(mktemp -d)   # helpers' outputs; only results go to $OUT (8 files come back from the device)
LOG=$OUT/e2e.log
SUM=$OUT/summary.txt
: >"$LOG"; : >"$SUM"
export GPUSWEEP_CONFIG=/nonexistent/gpusweep.toml GPUSWEEP_AUDIT_LOG=$OUT/actions.jsonl PYTHONUNBUFFERED=1
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; tmux kill-server 2>/dev/null; rm -f /dev/shm/nccl-gpusweep-e2e-*; }
trap 'cleanup; rm -rf "$W"' EXIT

say() { echo "== $*" | tee -a "$LOG"; }
pass() { echo "PASS $*" | tee -a "$SUM" "$LOG"; }
fail() { echo "FAIL $*" | tee -a "$SUM" "$LOG"; }
note() { echo "NOTE $*" | tee -a "$SUM" "$LOG"; }
check() { local d=$1; shift; if "$@" >>"$LOG" 2>&1; then pass "$d"; else fail "$d"; fi; }
# wait_line FILE REGEX SECS: until the file has a matching line
wait_line() { local i=0; while ! grep -qE "$2" "$1" 2>/dev/null; do sleep 0.2; i=$((i+1)); [ $i -gt $(($3*5)) ] && return 1; done; return 0; }
# jcheck FILE EXPR: a Python expression over h (the first host of a snapshot) and K(kind, pid=None)
jcheck() {
  python3 - "$1" "$2" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["hosts"][0]
def K(kind, pid=None, **kw):
    return [f for f in h["findings"] if f["kind"] == kind and (pid is None or f["pid"] == pid)
            and all(f.get(k) == v for k, v in kw.items())]
ok = eval(sys.argv[2])
print("check:", sys.argv[2], "->", bool(ok))
sys.exit(0 if ok else 1)
PY
}
gpu0_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' '; }
# bg FILE CMD...: start in the background (this shell is its parent), pid in $BGPID
bg() { local out=$1; shift; "$@" >"$out" 2>&1 & BGPID=$!; PIDS+=("$BGPID"); }
stat_state() { awk '{print $3}' "/proc/$1/stat" 2>/dev/null; }

say "environment $(date -u +%FT%TZ)"
{ uname -a; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total,compute_cap --format=csv; python3 -c 'import torch; print("torch", torch.__version__)'; "$BIN" --version; } >>"$LOG" 2>&1

say "1. idle GPU reads clean"
"$BIN" snapshot >>"$LOG" 2>&1
"$BIN" snapshot --json >"$W/idle.json" 2>>"$LOG"
check "idle: every GPU reads used = 0 with the reservation apart" jcheck "$W/idle.json" 'all(g["memory"]["used"] == 0 and g["memory"]["reserved"] > 0 for g in h["gpus"])'
check "idle: no leak findings" jcheck "$W/idle.json" 'not [f for f in h["findings"] if f["severity"] == "leak"]'
check "idle: wait exits 0 at once" "$BIN" wait --timeout 5s
cat "$W/idle.json" >>"$LOG"; rm -f "$W/idle.json"

say "2. whole-process cost: gpusweep snapshot --json vs nvidia-smi, interleaved, medians of 40"
# The verdict (--no-gauges) reads memory, processes and, on a GPU with nothing listed, utilization (clean means
# idle): nvidia-smi reading memory.used and utilization.gpu reads as much; against memory.used alone the
# ratio is the cost of that utilization reading (its first costs the driver ~3.3 ms a GPU), printed as a NOTE.
# Reading the same gauges as a full snapshot (utilization, temperature, power) costs nvidia-smi what it costs
# gpusweep.
python3 - "$BIN" >"$OUT/bench.txt" 2>&1 <<'PY'
import statistics, subprocess, sys, time
b = sys.argv[1]
runs = {
    "gpusweep snapshot --json": [b, "snapshot", "--json"],
    "gpusweep snapshot --json --no-gauges": [b, "snapshot", "--json", "--no-gauges"],
    "nvidia-smi --query-gpu=memory.used": ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
    "nvidia-smi --query-gpu=memory.used,utilization.gpu,temperature.gpu,power.draw": ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu,temperature.gpu,power.draw", "--format=csv,noheader"],
    "nvidia-smi --query-gpu=memory.used,utilization.gpu": ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader"],
}
xs = {k: [] for k in runs}
for _ in range(40):
    for k, cmd in runs.items():
        a = time.perf_counter(); subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); xs[k].append((time.perf_counter() - a) * 1000)
m = {k: statistics.median(v) for k, v in xs.items()}
for k, v in xs.items():
    print("%-78s median %6.2f ms (min %.2f, max %.2f)" % (k, m[k], min(v), max(v)))
k = list(runs)
# The goal is "no slower"; both sides spend ~19 ms of it in the same driver calls, and medians of two equal
# commands differ by a few % from run to run on this host: on par means within 5%.
v, f, mem = m[k[1]] / m[k[4]], m[k[0]] / m[k[3]], m[k[1]] / m[k[2]]
print("NOTE the verdict against nvidia-smi reading memory.used alone: %.2fx" % mem)
print("RESULT verdict_ratio=%.2f full_ratio=%.2f verdict_on_par=%s full_on_par=%s" % (v, f, v <= 1.05, f <= 1.05))
PY
cat "$OUT/bench.txt" | tee -a "$LOG"
check "speed: snapshot --no-gauges on par (within 5%) with nvidia-smi reading memory.used and utilization.gpu" grep -q "verdict_on_par=True" "$OUT/bench.txt"
grep NOTE "$OUT/bench.txt" | tee -a "$SUM"
check "speed: a full snapshot on par (within 5%) with nvidia-smi reading the same gauges" grep -q "full_on_par=True" "$OUT/bench.txt"
"$BIN" snapshot --json --no-gauges >"$W/nogauges.json" 2>>"$LOG"
check "no-gauges: memory read, temperature and power N/A, gauges named as missing" jcheck "$W/nogauges.json" 'all(g["memory"]["used"] is not None and g["temperature_c"] is None and g["power_mw"] is None for g in h["gpus"]) and "gauges" in h.get("missing_features", [])'
"$BIN" snapshot --json >"$W/gauges.json" 2>>"$LOG"
check "gauges: a full snapshot reads utilization and power" jcheck "$W/gauges.json" 'all(g["utilization"] is not None and g["power_mw"] is not None for g in h["gpus"]) and "gauges" not in h.get("missing_features", [])'
if [ -x "$BENCH" ]; then
  say "in-process poll benchmark (criterion)"
  timeout 150 "$BENCH" --bench 2>&1 | grep -E "poll bench|time:|^poll|^analyze" | tee -a "$OUT/bench.txt" "$LOG"
fi

say "2b. clean means idle: busy_without_holder never fires on an idle GPU, during a job, or as it ends"
"$BIN" snapshot --json >"$W/idle.json" 2>>"$LOG"
check "busy: an idle GPU reads its utilization and has no busy_without_holder" jcheck "$W/idle.json" 'all(g["utilization"] is not None for g in h["gpus"]) and not K("busy_without_holder")'
check "busy: check passes an idle host" "$BIN" check
check "busy: wait passes an idle host" "$BIN" wait --timeout 10s
bg "$W/mm.out" python3 $G/matmul.py 20; P=$BGPID
if wait_line "$W/mm.out" READY 90; then
  sleep 2 # utilization is a sample of the last second: let the matmul fill one
  "$BIN" snapshot --json >"$W/busy-job.json" 2>>"$LOG"
  python3 -c 'import json,sys; h=json.load(open(sys.argv[1]))["hosts"][0]; print("NOTE during a job:", [(g["index"], g["utilization"], g["state"]) for g in h["gpus"]])' "$W/busy-job.json" | tee -a "$SUM"
  check "busy: a GPU a live job keeps busy is in use, no busy_without_holder" jcheck "$W/busy-job.json" 'h["gpus"][0]["state"] == "in_use" and not K("busy_without_holder")'
  check "busy: check passes a host whose job runs" "$BIN" check
  kill -KILL "$P"; wait "$P" 2>/dev/null
  # The moment it ends: utilization still samples the last second of work while nothing is listed.
  "$BIN" snapshot --json >"$W/busy-end.json" 2>>"$LOG"
  python3 -c 'import json,sys; h=json.load(open(sys.argv[1]))["hosts"][0]; print("NOTE just after the job:", [(g["index"], g["utilization"], g["state"]) for g in h["gpus"]], [(f["kind"], f["severity"]) for f in h["findings"]])' "$W/busy-end.json" | tee -a "$SUM"
  check "busy: just after the job, no busy_without_holder at leak severity" jcheck "$W/busy-end.json" 'not [f for f in h["findings"] if f["kind"] == "busy_without_holder" and f["severity"] == "leak"]'
  check "busy: check after the job's end (it reads again past the confirm window)" "$BIN" check
  check "busy: wait after the job's end reads clean" "$BIN" wait --timeout 20s
else fail "busy: matmul.py did not start"; cat "$W/mm.out" >>"$LOG"; fi

say "2c. readiness: the driver's recovery action, XID events watched by a serve, MIG mode as it is"
"$BIN" snapshot --json >"$W/ready.json" 2>>"$LOG"
python3 -c 'import json,sys; h=json.load(open(sys.argv[1]))["hosts"][0]; print("NOTE readiness:", [(g["index"], g.get("recovery_action"), g.get("mig_enabled"), len(g.get("mig", [])), len(g.get("reset_blockers", []))) for g in h["gpus"]])' "$W/ready.json" | tee -a "$SUM"
check "ready: a healthy GPU is not needs_reset and no needs_reset finding" jcheck "$W/ready.json" 'all(g["state"] != "needs_reset" for g in h["gpus"]) and not K("needs_reset")'
check "ready: the reset blockers name the persistence daemon where it runs" jcheck "$W/ready.json" '(not any(q["comm"].startswith("nvidia-persiste") for q in h["processes"])) or all(any(b["program"].startswith("nvidia-persist") for b in g.get("reset_blockers", [])) for g in h["gpus"])'
port=19471
"$BIN" serve --listen 127.0.0.1:$port --no-socket >"$W/serve-xid.log" 2>&1 & SP=$!
for _ in $(seq 50); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
curl -s "http://127.0.0.1:$port/api/v1/snapshot" >"$W/serve-xid.json" || true
curl -s "http://127.0.0.1:$port/metrics" >"$W/serve-xid.prom" || true
kill "$SP"; wait "$SP" 2>/dev/null
check "ready: a serve watches XID events on every GPU (xids since it started), none seen on a healthy GPU" jcheck "$W/serve-xid.json" 'all(g.get("xids") is not None and not g["xids"]["counts"] for g in h["gpus"])'
check "ready: /metrics carries the recovery action and the reset blockers" grep -q "gpusweep_reset_blockers{" "$W/serve-xid.prom"

say "3. a PyTorch process holding 20 GB is listed with its cmdline"
bg "$W/hold.out" python3 $G/hold.py 20; P=$BGPID
if wait_line "$W/hold.out" READY 90; then
  "$BIN" snapshot --json >"$W/hold.json" 2>>"$LOG"; "$BIN" snapshot >>"$LOG" 2>&1
  check "holder: pid $P listed on GPU 0 with >= 20 GiB and its cmdline" jcheck "$W/hold.json" "any(p['pid'] == $P and p['used_bytes'] >= 20*2**30 for p in h['gpus'][0]['processes']) and any(q['pid'] == $P and 'hold.py' in q['cmdline'] for q in h['processes'])"
  check "holder: a live listed process is in use, not a leak" jcheck "$W/hold.json" 'not [f for f in h["findings"] if f["severity"] == "leak"]'
  check "holder: the holder's fds on /dev/nvidia0 are seen" jcheck "$W/hold.json" "any(x['pid'] == $P and 0 in x['gpus'] for x in h['holders'])"
  check "holder: the snapshot carries its pidfs inode" jcheck "$W/hold.json" "any(q['pid'] == $P and q.get('pidfs_ino', 0) > 1 for q in h['processes'])"
  check "holder: gpusweep kill --grace 5s ends it" "$BIN" kill "$P" --yes --grace 5s
  check "holder: its audit record was sent through a pidfd with the pidfs inode" python3 -c "import json,sys; r=[json.loads(l) for l in open('$OUT/actions.jsonl')]; sys.exit(0 if any(x['pid']==$P and x['method']=='pidfd' and (x.get('pidfs_ino') or 0)>1 for x in r) else 1)"
  rm -f "$W/hold.json"
  check "holder: then wait sees 0 MiB" "$BIN" wait --timeout 20s
else fail "holder: hold.py did not start"; cat "$W/hold.out" >>"$LOG"; fi

say "4. the fork leak: parent SIGKILLed, a forked child keeps 10 GB alive"
bg "$W/fork.out" python3 $G/fork_leak.py 10
if wait_line "$W/fork.out" PARENT 90; then
  read -r _ PARENT _ CHILD < <(grep PARENT "$W/fork.out")
  kill -9 "$PARENT"; wait "$PARENT" 2>/dev/null
  say "parent $PARENT killed; child $CHILD; nvidia-smi now says:"
  nvidia-smi 2>&1 | tail -8 >>"$LOG"
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory,process_name --format=csv,noheader,nounits >>"$LOG" 2>&1
  "$BIN" snapshot --json >"$OUT/forkleak.json" 2>>"$LOG"; "$BIN" snapshot >>"$LOG" 2>&1
  check "fork leak: ghost = dead parent $PARENT" jcheck "$OUT/forkleak.json" "K('ghost', $PARENT, gpu=0)"
  check "fork leak: hidden holder = child $CHILD" jcheck "$OUT/forkleak.json" "K('hidden_holder', $CHILD, gpu=0)"
  check "fork leak: child $CHILD is an orphan (ppid 1)" jcheck "$OUT/forkleak.json" "K('orphan', $CHILD)"
  check "fork leak: residual of about 10 GB on GPU 0" jcheck "$OUT/forkleak.json" "any(f['bytes'] >= 9*2**30 for f in K('residual', gpu=0))"
  # Blind spots, named: as an unprivileged user root's fds cannot be read; inside a PID namespace NVML lists
  # nothing. Neither may say "nobody holds it".
  install -m 755 "$BIN" /tmp/gpusweep-e2e-bin
  setpriv --reuid 65534 --regid 65534 --clear-groups /tmp/gpusweep-e2e-bin snapshot --json >"$W/nobody.json" 2>>"$LOG"
  setpriv --reuid 65534 --regid 65534 --clear-groups /tmp/gpusweep-e2e-bin snapshot >>"$LOG" 2>&1
  check "fork leak as uid 65534: the ghost names what could not be inspected and says run as root" jcheck "$W/nobody.json" "any('could not be inspected' in f['detail'] and 'root' in f['action'] for f in K('ghost', $PARENT))"
  check "fork leak as uid 65534: no finding claims that no live process holds the GPU" jcheck "$W/nobody.json" "not any('no live process' in f['detail'] for f in h['findings'])"
  unshare --pid --fork --mount-proc /tmp/gpusweep-e2e-bin snapshot --json >"$W/ns.json" 2>>"$LOG"
  unshare --pid --fork --mount-proc /tmp/gpusweep-e2e-bin snapshot >>"$LOG" 2>&1
  check "fork leak from a PID namespace: the residual says the holder is outside it" jcheck "$W/ns.json" "any('PID namespace' in f['detail'] and 'outside' in f['detail'] for f in K('residual', gpu=0))"
  rm -f "$W/nobody.json" "$W/ns.json" /tmp/gpusweep-e2e-bin
  "$BIN" sweep --dry-run >"$W/plan.txt" 2>&1; cat "$W/plan.txt" >>"$LOG"
  check "fork leak: the plan names the child $CHILD and not the dead parent" bash -c "grep -qE '^ +[^ ]+ +$CHILD ' '$W/plan.txt' && ! grep -qE '^ +[^ ]+ +$PARENT ' '$W/plan.txt'"
  "$BIN" sweep --yes --grace 5s --timeout 60s >"$W/sweep.txt" 2>&1; rc=$?
  cat "$W/sweep.txt" >>"$LOG"
  check "fork leak: sweep --yes exits 0 (clean)" test $rc -eq 0
  check "fork leak: GPU 0 reads 0 MiB after the sweep (nvidia-smi: $(gpu0_used_mib) MiB)" test "$(gpu0_used_mib)" = 0
  note "fork leak: $(grep -o 'clean: .*' "$W/sweep.txt")"
  rm -f "$W/plan.txt" "$W/sweep.txt"
else fail "fork leak: fork_leak.py did not start"; cat "$W/fork.out" >>"$LOG"; fi

say "5. a zombie: a parent that never waits for its CUDA child"
bg "$W/zombie.out" python3 $G/zombie.py 5 4
if wait_line "$W/zombie.out" PARENT 30; then
  read -r _ ZP _ ZC < <(grep PARENT "$W/zombie.out")
  i=0; while [ "$(stat_state "$ZC")" != Z ] && [ $i -lt 300 ]; do sleep 0.2; i=$((i+1)); done
  say "zombie $ZC state $(stat_state "$ZC"), GPU 0 used $(gpu0_used_mib) MiB"
  # The driver frees an exiting process's memory a moment after it turns Z: wait for that, and say how long.
  t0=$(date +%s%N); i=0; while [ "$(gpu0_used_mib)" != 0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  say "GPU 0 used $(gpu0_used_mib) MiB $(( ($(date +%s%N) - t0) / 1000000 )) ms later"
  "$BIN" snapshot --json >"$W/z.json" 2>>"$LOG"
  check "zombie: $ZC found, the action names its parent $ZP" jcheck "$W/z.json" "any(f['target_pid'] == $ZP for f in K('zombie', $ZC))"
  check "zombie: it holds no memory (GPU 0 clean)" jcheck "$W/z.json" 'h["gpus"][0]["memory"]["used"] == 0'
  grep -A1 '"zombie"' "$W/z.json" >>"$LOG"; rm -f "$W/z.json"
  kill -9 "$ZP"
else fail "zombie: zombie.py did not start"; fi

say "6. /dev/shm: a leftover nccl segment, and one still mapped by a live process"
dd if=/dev/zero of=/dev/shm/nccl-gpusweep-e2e-leftover bs=1M count=32 status=none
bg "$W/shm.out" python3 $G/shm_user.py nccl-gpusweep-e2e-inuse
wait_line "$W/shm.out" READY 20
"$BIN" snapshot --json >"$W/shm.json" 2>>"$LOG"
check "shm: the leftover is a finding" jcheck "$W/shm.json" "any('nccl-gpusweep-e2e-leftover' in f['detail'] for f in K('shm_leftover'))"
check "shm: the mapped one is not (its user is seen through /proc/PID/maps)" jcheck "$W/shm.json" "not any('nccl-gpusweep-e2e-inuse' in f['detail'] for f in K('shm_leftover')) and any(s['name'] == 'nccl-gpusweep-e2e-inuse' and s['users'] for s in h['shm']['segments'])"
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["hosts"][0]["shm"], indent=1))' "$W/shm.json" >>"$LOG"
rm -f "$W/shm.json" /dev/shm/nccl-gpusweep-e2e-*

say "7. the agent path: a real GPU through \`gpusweep agent\` on a local command transport"
bg "$W/hold2.out" python3 $G/hold.py 8; P=$BGPID
if wait_line "$W/hold2.out" READY 90; then
  "$BIN" snapshot --json --hosts "cmd:$BIN agent" >"$W/agent.json" 2>>"$LOG"
  check "agent: the GPU and pid $P come through the agent stream" jcheck "$W/agent.json" "h['source'] == 'agent' and h['error'] is None and any(p['pid'] == $P for p in h['gpus'][0]['processes'])"
  python3 -c 'import json,sys; h=json.load(open(sys.argv[1]))["hosts"][0]; print(h["host"], h["source"], [(g["index"], g["name"], g["memory"]) for g in h["gpus"]])' "$W/agent.json" >>"$LOG"
  rm -f "$W/agent.json"
  "$BIN" sweep --yes --hosts "cmd:$BIN agent" --grace 5s --timeout 30s >>"$LOG" 2>&1
  check "agent: a sweep through the agent brings GPU 0 to 0 MiB" test "$(gpu0_used_mib)" = 0
else fail "agent: hold.py did not start"; fi

say "8. the TUI under tmux on the real GPU: a leak appears, a sweep from the keyboard clears it"
bg "$W/fork2.out" python3 $G/fork_leak.py 10
if wait_line "$W/fork2.out" PARENT 90; then
  read -r _ PARENT _ CHILD < <(grep PARENT "$W/fork2.out"); kill -9 "$PARENT"
  tmux new-session -d -s gs -x 160 -y 48 "$BIN; echo EXITED \$?; sleep 60"
  cap() { tmux capture-pane -p -t gs; }
  until_screen() { local i=0; until cap | grep -q "$1"; do sleep 0.2; i=$((i+1)); [ $i -gt $(($2*5)) ] && return 1; done; return 0; }
  if until_screen "hidden_holder" 20; then
    { echo "---- leak on the real H200 ($(date -u +%FT%TZ))"; cap; } >>"$OUT/tui.txt"; pass "tui: the leak shows as findings"
    tmux send-keys -t gs S; sleep 0.5
    { echo "---- sweep dialog"; cap; } >>"$OUT/tui.txt"
    tmux send-keys -t gs Enter
    if until_screen "zero after" 40; then pass "tui: the sweep from the keyboard ends with the all-zero banner"; else fail "tui: no all-zero banner"; fi
    { echo "---- after the sweep"; cap; } >>"$OUT/tui.txt"
    check "tui: GPU 0 reads 0 MiB" test "$(gpu0_used_mib)" = 0
  else fail "tui: the leak did not show"; { echo "---- screen"; cap; } >>"$OUT/tui.txt"; fi
  tmux send-keys -t gs q; sleep 0.5; tmux kill-server 2>/dev/null
else fail "tui: fork_leak.py did not start"; fi

say "9. TUI idle cost: 30 s at a 1 s poll (real GPU), then the demo cluster"
tui_cpu() {
  tmux new-session -d -s idle -x 160 -y 48 "exec $*"; sleep 2
  local pid; pid=$(tmux list-panes -t idle -F '#{pane_pid}')
  local t0 t1; t0=$(awk '{print $14+$15}' /proc/$pid/stat); sleep 30; t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  local rss; rss=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
  tmux kill-session -t idle
  python3 -c "import os,sys; t=(int(sys.argv[2])-int(sys.argv[1]))/os.sysconf('SC_CLK_TCK'); print('TUI %s: %.2f%% of one core over 30 s, %.1f MB resident' % (sys.argv[4], 100*t/30, int(sys.argv[3])/1024))" "$t0" "$t1" "$rss" "$*"
}
tui_cpu "$BIN" | tee -a "$OUT/bench.txt" "$LOG"
tui_cpu "$BIN" --demo | tee -a "$OUT/bench.txt" "$LOG"

say "10. an EP-style job on one GPU: launcher + 4 workers, launcher SIGKILLed, swept"
WORKERS=4 GPUS=1 GB=8 OUT="$OUT" BIN="$BIN" bash scripts/gpu-ep.sh >>"$LOG" 2>&1
grep -E "^(PASS|FAIL|NOTE)" "$OUT/ep.log" | sed 's/^/  ep: /' | tee -a "$SUM"

say "11. kills on a kernel without pidfd (a seccomp filter), and a frozen GPU holder"
bg "$W/hold3.out" python3 $G/hold.py 5; P=$BGPID
if wait_line "$W/hold3.out" READY 90; then
  python3 $G/nopidfd.py "$BIN" kill "$P" --yes --grace 5s >"$W/nopidfd.txt" 2>&1; cat "$W/nopidfd.txt" >>"$LOG"
  check "no pidfd: the kill is refused in words" grep -q "this kernel has no pidfd; kills are disabled" "$W/nopidfd.txt"
  check "no pidfd: the holder $P lives" kill -0 "$P"
  python3 $G/nopidfd.py "$BIN" snapshot --json >"$W/nopidfd.json" 2>>"$LOG"
  check "no pidfd: pidfd is among the host's missing features" jcheck "$W/nopidfd.json" "'pidfd' in h.get('missing_features', [])"
  check "no pidfd: --kill-without-pidfd ends it" python3 $G/nopidfd.py "$BIN" kill "$P" --yes --grace 5s --kill-without-pidfd
  check "no pidfd: the audit record says kill(2)" python3 -c "import json,sys; r=[json.loads(l) for l in open('$OUT/actions.jsonl')]; sys.exit(0 if any(x['pid']==$P and 'kill(2)' in x['method'] for x in r) else 1)"
  check "no pidfd: then wait sees 0 MiB" "$BIN" wait --timeout 20s
else fail "no pidfd: hold.py did not start"; fi
CG=$(awk '$9 == "cgroup2" {print $5; exit}' /proc/self/mountinfo)
bg "$W/hold4.out" python3 $G/hold.py 5; P=$BGPID
if [ -n "$CG" ] && wait_line "$W/hold4.out" READY 90 && mkdir "$CG/gpusweep-e2e-frozen" 2>>"$LOG"; then
  echo "$P" >"$CG/gpusweep-e2e-frozen/cgroup.procs"; echo 1 >"$CG/gpusweep-e2e-frozen/cgroup.freeze"; sleep 1
  echo "frozen holder $P: $(grep State /proc/$P/status), wchan $(cat /proc/$P/wchan)" | tee -a "$SUM" "$LOG"
  "$BIN" snapshot --json >"$W/frozen.json" 2>>"$LOG"
  python3 -c "import json; h=json.load(open('$W/frozen.json'))['hosts'][0]; print('NOTE frozen: findings', sorted({f['kind'] for f in h['findings']}))" | tee -a "$SUM"
  "$BIN" kill "$P" --yes --signal KILL --grace 0s >"$W/frozen-kill.txt" 2>&1; echo "NOTE frozen: kill says: $(tr '\n' ' ' <"$W/frozen-kill.txt")" | tee -a "$SUM"
  echo 0 >"$CG/gpusweep-e2e-frozen/cgroup.freeze" 2>/dev/null
  check "frozen: after thawing, wait sees 0 MiB" "$BIN" wait --timeout 20s
  rmdir "$CG/gpusweep-e2e-frozen" 2>>"$LOG"
else fail "frozen: no cgroup v2 leaf or hold.py did not start"; fi

say "12. holders whose GPU fds are not in /proc/PID/fd: a leader that exited, a thread with its own fd table"
for mode in leader_exit private; do
  bg "$W/threads-$mode.out" python3 $G/threads.py "$mode" 6; P=$BGPID
  if wait_line "$W/threads-$mode.out" READY 90; then
    [ "$mode" = leader_exit ] && { i=0; while [ "$(stat_state "$P")" != Z ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; }
    say "$mode: pid $P, leader state $(stat_state "$P"), threads $(ls /proc/$P/task | wc -l), fds on /dev/nvidia* in the leader's table: $(ls -l /proc/$P/fd 2>/dev/null | grep -c /dev/nvidia)"
    "$BIN" snapshot --json >"$W/threads.json" 2>>"$LOG"; "$BIN" snapshot >>"$LOG" 2>&1
    check "$mode: pid $P is a holder of GPU 0 (its fds seen through a thread)" jcheck "$W/threads.json" "any(x['pid'] == $P and 0 in x['gpus'] for x in h['holders'])"
    check "$mode: pid $P is alive (not a zombie, not a ghost)" jcheck "$W/threads.json" "not K('zombie', $P) and not K('ghost', $P) and any(q['pid'] == $P and q['state'] != 'Z' for q in h['processes'])"
    check "$mode: gpusweep kill ends it" "$BIN" kill "$P" --yes --grace 5s
    check "$mode: then wait sees 0 MiB" "$BIN" wait --timeout 20s
    rm -f "$W/threads.json"
  else fail "$mode: threads.py did not start"; cat "$W/threads-$mode.out" >>"$LOG"; fi
done

say "summary"
cat "$SUM"
grep -q '^FAIL' "$SUM" && exit 1 || exit 0
