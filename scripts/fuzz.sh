#!/usr/bin/env bash
# A short fuzz run of the egress parsers (the TLS ClientHello and the proxy
# request head), as CI does; any crash fails it. Longer runs by hand:
#   FUZZ_SECONDS=600 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/.cargo/bin:$PATH
seconds=${FUZZ_SECONDS:-20}
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "installing the nightly toolchain (libFuzzer instrumentation needs it)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo +nightly install cargo-fuzz --locked --quiet
fi
for target in client_hello connect; do
  echo "fuzzing $target for ${seconds}s"
  # Corpus under target/ so the repository stays clean; the run starts from
  # what earlier runs found.
  corpus=fuzz/target/corpus/$target
  mkdir -p "$corpus"
  cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$corpus" -- \
    -max_total_time="$seconds" -max_len=20000 -print_final_stats=1 2>&1 | tail -n 4
done
