# Sourced by scripts/scale-fleet.sh and scripts/scale-prom-steady.sh after scripts/lib/host.sh: the demo fleet
# they read, served by one `gpusweep serve --demo` and, for `prom:`, scraped by a real Prometheus. The
# scratch folder D, the PIDS and the tmux server S are ended on exit.

# A scratch folder D without a config, the PIDS started and a tmux server S named after $1, all ended on exit.
fleet_scratch() {
  D=$(mktemp -d)
  PIDS=()
  S=gpusweep-$1-$$
  trap 'tmux -L "$S" kill-server 2>/dev/null || true; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$D"' EXIT
  export GPUSWEEP_CONFIG=$D/none.toml GPUSWEEP_SOCKET=$D/none.sock
}

# End the TUI's tmux server S and wait until it is gone: a new session started while the old server still
# exits is answered "server exited unexpectedly" (a round after another, seen at 1,000 hosts).
tui_end() {
  local pid
  pid=$(tmux -L "$S" display-message -p '#{pid}' 2>/dev/null || true)
  tmux -L "$S" kill-server 2>/dev/null || true
  [ -n "$pid" ] || return 0
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.05; done
}

# The fleet's names: mostly quiet hosts after a pkill, some warming up, some Blackwell (gpu-b0001..,
# gpu-a001.., gpu-c001..), one a line.
fleet_names() {
  local n=$1 a=$(( $1 / 20 )) c=$(( $1 / 20 ))
  local b=$(( n - a - c ))
  for i in $(seq 1 "$b"); do printf 'gpu-b%04d\n' "$i"; done
  for i in $(seq 1 "$a"); do printf 'gpu-a%03d\n' "$i"; done
  for i in $(seq 1 "$c"); do printf 'gpu-c%03d\n' "$i"; done
}

# One `$BIN serve --demo` of the hosts in $D/names, polled every second, answering: its port in PORT, its PID
# in SERVE_PID.
serve_fleet() {
  PORT=$(free_port)
  "$BIN" serve --demo --hosts "$(paste -sd, "$D/names")" --listen "127.0.0.1:$PORT" --interval 1s 2>"$D/serve.err" &
  SERVE_PID=$!
  PIDS+=("$SERVE_PID")
  for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
}

# Prometheus scraping each of the serve's $1 hosts at its own path every $2, until every host's reading is in
# it: its port in PP, its PID in PROM_PID.
scrape_fleet() {
  local n=$1 every=$2
  PP=$(free_port)
  { echo "global: {scrape_interval: $every, scrape_timeout: 4s}"; echo "scrape_configs:"; echo "  - job_name: gpusweep"; echo "    static_configs:"
    while read -r h; do echo "      - {targets: ['127.0.0.1:$PORT'], labels: {__metrics_path__: /hosts/$h/metrics, node: $h}}"; done <"$D/names"
    echo "    relabel_configs:"; echo "      - {source_labels: [node], target_label: instance}"; } >"$D/prometheus.yml"
  prometheus --config.file="$D/prometheus.yml" --storage.tsdb.path="$D/data" --web.listen-address="127.0.0.1:$PP" --log.level=warn >/dev/null 2>&1 &
  PROM_PID=$!
  PIDS+=("$PROM_PID")
  until [ "$(curl -sf "http://127.0.0.1:$PP/api/v1/query" --data-urlencode 'query=count(gpusweep_reading_timestamp_seconds)' | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)' 2>/dev/null)" = "$n" ]; do sleep 0.5; done
}

# The fleet the steady `prom:` scripts hold for every round: scratch $1, N=$2 demo hosts in one serve, scraped
# every ${SCRAPE:-15s} by a real Prometheus.
held_prom_fleet() {
  fleet_scratch "$1"
  fleet_names "$2" >"$D/names"
  serve_fleet
  scrape_fleet "$2" "${SCRAPE:-15s}"
}

# A process's CPU so far, in clock ticks (user + system).
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
