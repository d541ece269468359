#!/usr/bin/env bash
# The lints (clippy, warnings fail) and a short fuzz run of every parser of
# untrusted bytes (10 s a target; the long runs are by hand: docs/testing.md,
# Fuzzing), at the lowest CPU and I/O priority. scripts/test.sh runs this
# beside the tests, which mostly wait on daemons and sandboxes: so it builds
# on its own (clippy in a target directory of its own, the fuzz targets
# instrumented in fuzz/target) and the tests keep the CPU whenever they
# want it. Usable by hand as well.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/.cargo/bin:$PATH
started=$SECONDS
# The lowest priority for everything below (and what it starts).
renice -n 19 -p $$ >/dev/null
ionice -c 3 -p $$
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/clippy" \
  timeout -k 60 2400 cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== clippy: $((SECONDS - started)) s"
FUZZ_BUILD=${FUZZ_BUILD:-dev} FUZZ_SECONDS=${FUZZ_SECONDS:-10} timeout -k 60 2400 scripts/fuzz.sh
echo "== fuzzing: $((SECONDS - started)) s"
