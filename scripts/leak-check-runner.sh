#!/usr/bin/env bash
# Cargo's runner for the test binaries of scripts/test.sh
# (CARGO_TARGET_<host>_RUNNER): runs one test binary, then
# `leak-check.sh after` against the reading scripts/test.sh took at its
# start (CAIRN_LEAK_CHECK_STATE). Anything new on the host fails the binary,
# which stops `cargo test` there, naming the binary. The binary's own exit
# status is kept when it failed.
set -uo pipefail
state=${CAIRN_LEAK_CHECK_STATE:?CAIRN_LEAK_CHECK_STATE names the reading to compare with}
# Each binary's wall time, start to exit (libtest's "finished in" leaves out
# what runs after its last test: fixtures torn down at exit).
began=$(date +%s%N)
"$@"
rc=$?
echo "== test binary ${1##*/}: $(( ($(date +%s%N) - began) / 1000000 )) ms" >&2
if ! timeout 120 "$(dirname "$0")/leak-check.sh" after "$state" >&2; then
  echo "leak-check: the host has something new after test binary ${1##*/} (see the lines above)" >&2
  ((rc)) || rc=1
fi
exit "$rc"
