#!/usr/bin/env bash
# What a `prom:` TUI costs Prometheus once its first view is up, builds side by side on one held server: one
# `gpusweep serve --demo` of N hosts scraped by a real Prometheus (one target per host, as
# scripts/scale-fleet.sh sets them up), then for each round and build the TUI at a 1 s poll with
# GPUSWEEP_TRACE=1: its first complete view, then over SECS Prometheus's CPU, how many queries the client
# asked and their answer times summed, and how many hosts it called down; Prometheus alone before and after.
#   BINS="/tmp/before /tmp/after" scripts/scale-prom-steady.sh N [SECS] [ROUNDS]   (SCRAPE=15s its interval;
#                                                    TRACES=DIR keeps each run's trace there)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?hosts}; SECS=${2:-125}; ROUNDS=${3:-2}
read -r -a BINS <<<"${BINS:?builds to compare, space-separated}"
BIN=${BINS[0]}
source scripts/lib/host.sh
source scripts/lib/fleet.sh
held_prom_fleet steady "$N"
TCK=$(getconf CLK_TCK)
now() { date +%s.%N; }
alone() {
  local a b; a=$(cpu_ticks "$PROM_PID"); sleep 60; b=$(cpu_ticks "$PROM_PID")
  awk -v a="$a" -v b="$b" -v t="$TCK" 'BEGIN { printf "Prometheus alone (60 s): %.1f%% of one core\n", 100*(b-a)/t/60 }'
}
alone
for _ in $(seq 1 "$ROUNDS"); do
  for BIN in "${BINS[@]}"; do
    E=$D/events.jsonl; T=$D/trace; rm -f "$E" "$T"
    T0=$(now)
    tmux -L "$S" new-session -d -s steady -x 160 -y 48 \
      "GPUSWEEP_TRACE=1 exec $(printf '%q' "$BIN") --hosts prom:http://127.0.0.1:$PP --interval 1s --connect-timeout 120 --events $E 2>$T"
    until [ -s "$E" ] && [ "$(grep -c '"event":"host_up"' "$E")" -ge "$N" ]; do
      sleep 0.05
      if awk -v t0="$T0" -v n="$(now)" 'BEGIN { exit !(n - t0 > 300) }'; then echo "$BIN: not every host up after 300 s" >&2; break; fi
    done
    T1=$(now)
    sleep 5
    # The window in the trace's own clock (milliseconds since the TUI started).
    W0=$(awk -v a="$T0" -v b="$(now)" 'BEGIN { print (b - a) * 1000 }')
    P0=$(cpu_ticks "$PROM_PID"); sleep "$SECS"; P1=$(cpu_ticks "$PROM_PID")
    W1=$(awk -v a="$T0" -v b="$(now)" 'BEGIN { print (b - a) * 1000 }')
    tui_end
    [ -n "${TRACES:-}" ] && mkdir -p "$TRACES" && cp "$T" "$TRACES/$(basename "$BIN").$(date +%s).trace"
    Q=$(awk -v w0="$W0" -v w1="$W1" '/bytes in [0-9]+ ms/ {
          match($0, /\[ *[0-9.]+ ms\]/); at = substr($0, RSTART + 1, RLENGTH - 5) + 0
          match($0, /bytes in [0-9]+ ms/); ms = substr($0, RSTART + 9, RLENGTH - 12) + 0
          if (at > w0 && at < w1) { n++; s += ms } }
        END { printf "%d queries answered in %.1f s summed", n, s / 1000 }' "$T")
    awk -v a="$P0" -v b="$P1" -v t="$TCK" -v s="$SECS" -v t0="$T0" -v t1="$T1" -v bin="$BIN" -v q="$Q" \
      -v down="$(grep -c '"event":"host_down"' "$E" || true)" \
      'BEGIN { printf "%s: first complete view %.1f s; over %d s: Prometheus %.1f%% of one core, %s, %d hosts called down\n", bin, t1 - t0, s, 100*(b-a)/t/s, q, down }'
  done
done
alone
