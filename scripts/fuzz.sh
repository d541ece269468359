#!/usr/bin/env bash
# A short fuzz run of every parser of untrusted bytes, as CI does; any crash
# fails it. Longer runs, or some targets only, by hand:
#   FUZZ_SECONDS=600 scripts/fuzz.sh
#   FUZZ_SECONDS=600 scripts/fuzz.sh image_layer oci_documents
#   FUZZ_RUNS=1000000 scripts/fuzz.sh      # a number of inputs, not a time
#   FUZZ_BUILD=dev scripts/fuzz.sh         # unoptimised: a quicker build for short runs (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/.cargo/bin:$PATH
seconds=${FUZZ_SECONDS:-20}
# Release (the default) for long runs; dev builds in about half the time,
# which is what a run of seconds a target wants.
case ${FUZZ_BUILD:-release} in
  release) build=() ;;
  dev) build=(--dev) ;;
  *) echo "FUZZ_BUILD=${FUZZ_BUILD}: the builds are release and dev" >&2; exit 2 ;;
esac
if [ -n "${FUZZ_RUNS:-}" ]; then
  limit=(-runs="$FUZZ_RUNS")
  what="$FUZZ_RUNS inputs"
else
  limit=(-max_total_time="$seconds")
  what="${seconds}s"
fi
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "installing the nightly toolchain (libFuzzer instrumentation needs it)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo +nightly install cargo-fuzz --locked --quiet
fi
# Every target, as fuzz/Cargo.toml lists them (fuzz/README.md says what
# each covers; each has a seed corpus in fuzz/corpus/<target>/), or those
# named.
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz)
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz targets found in fuzz/Cargo.toml" >&2
  exit 1
fi
# One build of them all (they share their dependencies), then the runs.
cargo +nightly fuzz build "${build[@]}" --fuzz-dir fuzz
# What a target writes (image_layer unpacks each input) goes under a
# directory of its own, emptied before its run and removed after it (so
# that two runs of other targets can go side by side).
trap 'rm -rf "${TMPDIR:-/nonexistent}"' EXIT
for target in "${targets[@]}"; do
  echo "fuzzing $target for $what"
  export TMPDIR=$PWD/fuzz/target/tmp/$target
  # New inputs go to the first corpus directory, under target/, so the
  # repository stays clean; the run starts from what earlier runs found and
  # from the seeds in the repository (read only).
  corpus=fuzz/target/corpus/$target
  mkdir -p "$corpus"
  rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
  log=fuzz/target/$target.log
  if ! cargo +nightly fuzz run "${build[@]}" --fuzz-dir fuzz "$target" "$corpus" "fuzz/corpus/$target" -- \
    "${limit[@]}" -max_len=20000 -print_final_stats=1 >"$log" 2>&1; then
    # The panic and the reproducer, without the input's bytes.
    grep -v '^\s*\[' "$log" | grep -m 1 -A 4 'panicked\|ERROR' || true
    grep -A 1 'Reproduce with' "$log" || tail -n 20 "$log"
    echo "fuzz target $target failed (its whole output: $log)" >&2
    exit 1
  fi
  # The count of inputs run and their rate, from libFuzzer's final stats.
  grep -E 'stat::(number_of_executed_units|average_exec_per_sec|new_units_added)' "$log" | tr '\n' ' '
  echo
  rm -rf "$TMPDIR"
done
