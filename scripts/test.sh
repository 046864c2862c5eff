#!/usr/bin/env bash
# Every gate and every test, on a fresh Debian machine with Rust. Installs the test-only system packages the
# tests need when they are missing: tmux (the TUI test), openssh-server/client (the SSH tests, which start
# their own sshd on loopback), slurmctld, slurmd, slurm-client and munge (the Slurm test, which starts its
# own one-node cluster), prometheus (the metrics test, which starts its own server) and openssl, and from PyPI
# kubernetes-validate (in a venv under target/); then builds the packages and installs each
# (scripts/test-packages.sh, with lintian on the .deb). A real Kubernetes API server and etcd for the node writer's test are built from
# the Go module proxy into target/kube (scripts/kube-apiserver.sh; Go 1.26). Run as root (slurmd, the cgroup
# tests and dpkg need it).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v tmux >/dev/null 2>&1 || need+=(tmux)
{ [ -x /usr/sbin/sshd ] || [ -x /usr/bin/sshd ]; } || need+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
# A one-node Slurm on loopback for the prolog/epilog test.
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
# A real Prometheus on loopback scraping `gpusweep serve` (tests/prometheus.rs); openssl makes the TLS test's
# certificates.
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
# A Pushgateway: anyone who reaches one writes series under any labels (tests/prometheus.rs's impostor).
command -v prometheus-pushgateway >/dev/null 2>&1 || need+=(prometheus-pushgateway)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# Debian's python3 (not a per-user one): tests run it as an unprivileged user to play a local attacker.
[ -x /usr/bin/python3 ] || need+=(python3)
# Third-party readers of what gpusweep writes: jq (the JSON), man and mandoc's checker (the man pages), fish
# (its completions), systemd-analyze (the unit).
command -v jq >/dev/null 2>&1 || need+=(jq)
command -v man >/dev/null 2>&1 || need+=(man-db)
command -v mandoc >/dev/null 2>&1 || need+=(mandoc)
command -v fish >/dev/null 2>&1 || need+=(fish)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
# scripts/test-packages.sh reads the binary's dynamic symbols with objdump.
command -v objdump >/dev/null 2>&1 || need+=(binutils)
# ...and checks the .deb with Debian's own checker.
command -v lintian >/dev/null 2>&1 || need+=(lintian)
# kubernetes-validate (PyPI) checks deploy/kubernetes/ against Kubernetes 1.37's schemas, from a venv of its own.
command -v kubernetes-validate >/dev/null 2>&1 || /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null \
  || need+=(python3-venv)
# Go builds the API server for tests/kube.rs: the machine's (/usr/local/go), else Debian's, which fetches the
# 1.26 toolchain from the module proxy (GOTOOLCHAIN; Debian's Go must be 1.21 or newer for that).
export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null 2>&1 || { need+=(golang-go); export GOTOOLCHAIN=go1.26.8; }
if [ ${#need[@]} -gt 0 ]; then
  echo "installing test packages: ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  if [ ! -x target/kv/bin/kubernetes-validate ]; then
    echo "installing kubernetes-validate 1.37.0 (PyPI) into target/kv"
    /usr/bin/python3 -m venv target/kv
    target/kv/bin/pip install -q kubernetes-validate==1.37.0
  fi
  export PATH="$PWD/target/kv/bin:$PATH"
fi
./scripts/kube-apiserver.sh
cargo fmt --all --check
# Every crate of the workspace, in both builds: the CLI's (no Kubernetes client) and the serve's node writer
# (--features kube), which the tests run.
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --locked --features kube -- -D warnings
log=$(mktemp)
# The act notes every sweep of the tests leaves for other watchers, in a place of their own, not the host's.
GPUSWEEP_ACTS_DIR=$(mktemp -d)
export GPUSWEEP_ACTS_DIR
trap 'rm -f "$log"; rm -rf "$GPUSWEEP_ACTS_DIR"' EXIT
cargo test --workspace --all-targets --locked --features kube 2>&1 | tee "$log"
# One closing line with the totals over every test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "all tests: %d passed, %d failed\n", p, f }' "$log"
# The packages (wheel, .deb, tarball): built for glibc 2.17 and installed each in a clean place.
./scripts/test-packages.sh
