#!/usr/bin/env bash
# Build the release binary and the poll benchmark here, and stage both in .gpu/ (git-ignored) for a GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
cargo bench --bench poll --no-run
mkdir -p .gpu
cp target/release/gpusweep .gpu/gpusweep
cp "$(ls -t target/release/deps/poll-* | grep -v '\.d$' | head -1)" .gpu/poll-bench
ls -la .gpu
