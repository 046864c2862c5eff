#!/usr/bin/env bash
# What a steady `prom:` TUI costs Prometheus, builds side by side on one held server: one `gpusweep serve
# --demo` of N hosts scraped by a real Prometheus (as scripts/scale-prom-steady.sh sets them up), then for each
# round and build the TUI at a 1 s poll with GPUSWEEP_TRACE=1, from 20 s after its whole first read was
# answered: PAIRS windows of SECS with the client running, each followed by SECS with it stopped (SIGSTOP), so
# that Prometheus's own drift (its compactions, its scrapes' cost growing with its head) falls on both sides
# of each difference. Per window: Prometheus's CPU with and without the client, the difference in points of
# a core, and the queries the client's trace says were answered in it with their answering time summed (a
# query stopped in flight counts its stop too: read that column with the windows beside it).
#   BINS="/tmp/after /tmp/before" scripts/scale-prom-share.sh N [PAIRS] [SECS] [ROUNDS]   (SCRAPE=15s)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?hosts}; PAIRS=${2:-3}; SECS=${3:-60}; ROUNDS=${4:-2}
read -r -a BINS <<<"${BINS:?builds to compare, space-separated}"
BIN=${BINS[0]}
source scripts/lib/host.sh
source scripts/lib/fleet.sh
held_prom_fleet share "$N"
TCK=$(getconf CLK_TCK)
# Queries answered in a trace so far, and their answering time summed (s).
answered() {
  awk '/bytes in [0-9]+ ms/ { match($0, /bytes in [0-9]+ ms/); s += substr($0, RSTART + 9, RLENGTH - 12); n++ }
       END { printf "%d %.1f", n, s / 1000 }' "$1"
}
for r in $(seq 1 "$ROUNDS"); do
  for BIN in "${BINS[@]}"; do
    T=$D/trace; E=$D/events.jsonl; rm -f "$T" "$E"
    tmux -L "$S" new-session -d -s share -x 160 -y 48 \
      "GPUSWEEP_TRACE=1 exec $(printf '%q' "$BIN") --hosts prom:http://127.0.0.1:$PP --interval 1s --connect-timeout 120 --events $E 2>$T"
    # The whole first read is answered once its findings by kind are (the last of its queries; named by
    # `Hostname` in a fleet small enough to be).
    until grep -Eq 'gpusweep_findings\{[^}]*\}\) > 0' "$T" 2>/dev/null; do
      sleep 0.5
      kill -0 "$(tmux -L "$S" list-panes -F '#{pane_pid}' 2>/dev/null | head -1)" 2>/dev/null || { echo "$BIN: the TUI ended" >&2; exit 1; }
    done
    sleep 20
    C=$(tmux -L "$S" list-panes -F '#{pane_pid}' | head -1)
    for _ in $(seq 1 "$PAIRS"); do
      q0=$(answered "$T"); a=$(cpu_ticks "$PROM_PID"); sleep "$SECS"; b=$(cpu_ticks "$PROM_PID"); q1=$(answered "$T")
      kill -STOP "$C"
      c=$(cpu_ticks "$PROM_PID"); sleep "$SECS"; d=$(cpu_ticks "$PROM_PID")
      kill -CONT "$C"
      awk -v a="$a" -v b="$b" -v c="$c" -v d="$d" -v t="$TCK" -v s="$SECS" -v bin="$BIN" -v q0="$q0" -v q1="$q1" 'BEGIN {
        split(q0, x, " "); split(q1, y, " "); w = 100*(b-a)/t/s; o = 100*(d-c)/t/s
        printf "%s: Prometheus %.1f%% with the client, %.1f%% without: %.1f points; %d queries answered in %.1f s (%.1f%% of the window)\n",
          bin, w, o, w - o, y[1] - x[1], y[2] - x[2], 100*(y[2]-x[2])/s }'
    done
    echo "$BIN: $(grep -c '"event":"host_down"' "$E" || true) hosts called down"
    tui_end
  done
done
