#!/usr/bin/env bash
# Scale of the fleet client: N demo hosts read three ways, side by side on this machine.
#   cmd   N `cmd:gpusweep agent --demo --demo-host gpu-bNNNN` hosts (one agent process each)
#   http  one `gpusweep serve --demo` serving N hosts, read as N http://.../hosts/NAME hosts
#   prom  the same serve scraped by a real Prometheus (one target per host), read as one prom: spec
# For each: the first complete `snapshot --json` (every host read), the TUI's first complete view (its
# --events file holds a host_up for every host), and the TUI's CPU and memory at a 1 s poll over SECS.
#   scripts/scale-fleet.sh MODE N [SECS]      (needs tmux; prom needs prometheus; SCRAPE=15s its interval;
#                                              PERF=FILE profiles the TUI meanwhile; BIN=PATH the build)
# all-smi's viewer, measured the same way on its own mock nodes: scripts/scale-allsmi.sh N [SECS].
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?cmd, http or prom}; N=${2:?hosts}; SECS=${3:-30}
source scripts/lib/host.sh
source scripts/lib/fleet.sh
fleet_scratch scale
fleet_names "$N" >"$D/names"
case "$MODE" in
  cmd)
    sed "s|^|cmd:$BIN agent --demo --demo-host |" "$D/names" >"$D/hosts"
    SPEC=(--hostfile "$D/hosts") ;;
  http|prom)
    serve_fleet
    if [ "$MODE" = http ]; then
      sed "s|^|http://127.0.0.1:$PORT/hosts/|" "$D/names" >"$D/hosts"
      SPEC=(--hostfile "$D/hosts")
    else
      scrape_fleet "$N" "${SCRAPE:-5s}"
      SPEC=(--hosts "prom:http://127.0.0.1:$PP")
    fi ;;
  *) echo "mode: cmd, http or prom" >&2; exit 2 ;;
esac
# Connections the kernel dropped because a listener's accept queue was full (this machine's, all listeners).
overflows() { awk '/^TcpExt:/ { if (!h) { for (i = 1; i <= NF; i++) if ($i == "ListenOverflows") c = i; h = 1 } else print $c }' /proc/net/netstat; }
O0=$(overflows)
T0=$(date +%s.%N)
"$BIN" snapshot --json --connect-timeout 60 "${SPEC[@]}" >"$D/snap.json"
T1=$(date +%s.%N)
python3 - "$D/snap.json" "$T0" "$T1" "$N" "$MODE" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["hosts"]
ok = sum(1 for x in h if x["error"] is None)
print(f"{sys.argv[5]} {sys.argv[4]} hosts: snapshot read {ok}/{len(h)} in {float(sys.argv[3]) - float(sys.argv[2]):.2f} s")
PY
# Prometheus alone (scraping, no client reading it), to set its cost of the client's queries apart below.
if [ -n "${PROM_PID:-}" ]; then
  B0=$(awk '{print $14+$15}' "/proc/$PROM_PID/stat"); sleep "$SECS"; B1=$(awk '{print $14+$15}' "/proc/$PROM_PID/stat")
  awk -v c0="$B0" -v c1="$B1" -v tck="$(getconf CLK_TCK)" -v s="$SECS" -v n="$N" -v sc="${SCRAPE:-5s}" \
    'BEGIN { printf "prom %d hosts: Prometheus with no client (scraping every %s): %.1f%% of one core\n", n, sc, 100*(c1-c0)/tck/s }'
fi
# The TUI: first complete view (a host_up event for every host), then its cost at a 1 s poll.
CMD=$(printf '%q ' "$BIN" "${SPEC[@]}" --interval 1s --events "$D/events.jsonl")
T0=$(date +%s.%N)
tmux -L "$S" new-session -d -s scale -x 160 -y 48 "exec $CMD"
until [ -s "$D/events.jsonl" ] && [ "$(grep -c '"event":"host_up"' "$D/events.jsonl")" -ge "$N" ]; do
  sleep 0.02
  if awk -v t0="$T0" -v now="$(date +%s.%N)" 'BEGIN { exit !(now - t0 > 120) }'; then echo "TUI: not every host up after 120 s" >&2; break; fi
done
T1=$(date +%s.%N)
PID=$(tmux -L "$S" list-panes -t scale -F '#{pane_pid}')
awk -v a="$T0" -v b="$T1" -v n="$N" -v m="$MODE" -v o="$(( $(overflows) - O0 ))" 'BEGIN { printf "%s %d hosts: TUI first complete view in %.2f s (listen overflows: %d)\n", m, n, b - a, o }'
sleep 3
C0=$(awk '{print $14+$15}' "/proc/$PID/stat")
[ -n "${SERVE_PID:-}" ] && S0=$(awk '{print $14+$15}' "/proc/$SERVE_PID/stat")
[ -n "${PROM_PID:-}" ] && P0=$(awk '{print $14+$15}' "/proc/$PROM_PID/stat")
# PERF=FILE: the TUI profiled over the same window (a build with symbols: CARGO_PROFILE_RELEASE_DEBUG=1
# CARGO_PROFILE_RELEASE_STRIP=false), read with `perf report -i FILE`.
if [ -n "${PERF:-}" ]; then
  perf record -q -F 499 --call-graph dwarf,16384 -p "$PID" -o "$PERF" -- sleep "$SECS" 2>/dev/null
else
  sleep "$SECS"
fi
C1=$(awk '{print $14+$15}' "/proc/$PID/stat")
if [ -n "${SERVE_PID:-}" ]; then
  S1=$(awk '{print $14+$15}' "/proc/$SERVE_PID/stat")
  awk -v c0="$S0" -v c1="$S1" -v tck="$(getconf CLK_TCK)" -v s="$SECS" -v n="$N" -v m="$MODE" \
    -v th="$(awk '/^Threads:/{print $2}' "/proc/$SERVE_PID/status")" -v rss="$(awk '/VmRSS/{print $2}' "/proc/$SERVE_PID/status")" \
    'BEGIN { printf "%s %d hosts: the serve meanwhile: %.1f%% of one core, %d threads, %.0f MB resident\n", m, n, 100*(c1-c0)/tck/s, th, rss/1024 }'
fi
if [ -n "${PROM_PID:-}" ]; then
  # Prometheus's own CPU meanwhile: scraping every target, and answering this client's queries.
  P1=$(awk '{print $14+$15}' "/proc/$PROM_PID/stat")
  awk -v c0="$P0" -v c1="$P1" -v tck="$(getconf CLK_TCK)" -v s="$SECS" -v n="$N" -v sc="${SCRAPE:-5s}" \
    'BEGIN { printf "prom %d hosts: Prometheus meanwhile (scraping every %s): %.1f%% of one core\n", n, sc, 100*(c1-c0)/tck/s }'
fi
RSS=$(awk '/VmRSS/{print $2}' "/proc/$PID/status")
awk -v c0="$C0" -v c1="$C1" -v tck="$(getconf CLK_TCK)" -v s="$SECS" -v rss="$RSS" -v n="$N" -v m="$MODE" \
  'BEGIN { printf "%s %d hosts: TUI at a 1 s poll: %.1f%% of one core over %d s, %.0f MB resident\n", m, n, 100*(c1-c0)/tck/s, s, rss/1024 }'
# Hosts the TUI called down: each host kept answering here, so any is the client's own doing.
awk -v n="$N" -v m="$MODE" -v d="$(grep -c '"event":"host_down"' "$D/events.jsonl" || true)" \
  'BEGIN { printf "%s %d hosts: host_down events in the TUI: %d\n", m, n, d }'
