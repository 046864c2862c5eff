#!/usr/bin/env bash
# Build the release binary and the poll benchmark here, and stage both in .gpu/ (git-ignored) for a GPU host;
# with the wheel from scripts/package.sh too when dist/ has one (for scripts/gpu-wheel.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
cargo bench --bench poll --no-run
mkdir -p .gpu
cp target/release/gpusweep .gpu/gpusweep
cp "$(ls -t target/release/deps/poll-* | grep -v '\.d$' | head -1)" .gpu/poll-bench
rm -f .gpu/*.whl
for w in dist/gpusweep-*-manylinux*_x86_64.whl; do [ -e "$w" ] && cp "$w" .gpu/; done
ls -la .gpu
