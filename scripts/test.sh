#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every test of the workspace:
# unit tests per crate and integration tests against real daemons,
# sandboxes, cgroups and loop devices (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
# Every step has a time bound (seconds), so that a hang fails the run by name.
# Each step says how long it took (the run aims at 40 minutes on 2 cores).
started=$SECONDS
took() { echo "== $1: $((SECONDS - started)) s into the run"; }
timeout -k 60 1800 scripts/setup-debian.sh
took "set-up"
export PATH=$HOME/.cargo/bin:$PATH
# One build from scratch: incremental caches would only double the disk it uses.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# The lints and the short fuzz run (scripts/lints-and-fuzz.sh) go beside
# the tests once they are built, at the lowest priority, in a process group
# of their own so that a failing run stops them too; their verdict is read
# at the end.
side=
side_log=$(mktemp /tmp/cairn-lints-and-fuzz.XXXXXX)
stop_side() { [ -z "$side" ] || kill -- "-$side" 2>/dev/null || true; }
trap 'stop_side; rm -f "$side_log"' EXIT
# The host-wide leak check (scripts/leak-check.sh, docs/testing.md): its own
# test, then a reading of the host now; after every test binary (through
# cargo's runner) and after each `cargo test` the host must have nothing new.
timeout -k 30 120 scripts/leak-check-test.sh
export CAIRN_LEAK_CHECK_STATE LEAK_CHECK_MARK
CAIRN_LEAK_CHECK_STATE=$(mktemp -d /tmp/cairn-leak-check.XXXXXX)
# Every process the tests start inherits the mark: only those (and Cairn's
# own, by cgroup and name) are the check's, not other work on the host.
LEAK_CHECK_MARK=$CAIRN_LEAK_CHECK_STATE
trap 'stop_side; rm -f "$side_log"; rm -rf "$CAIRN_LEAK_CHECK_STATE"' EXIT
timeout 120 scripts/leak-check.sh before "$CAIRN_LEAK_CHECK_STATE"
runner_var=CARGO_TARGET_$(rustc -vV | sed -n 's/^host: //p' | tr 'a-z.-' 'A-Z__')_RUNNER
leak_checked() {
  local limit=$1
  shift
  env "$runner_var=$PWD/scripts/leak-check-runner.sh" timeout -k 60 "$limit" "$@"
  timeout 120 scripts/leak-check.sh after "$CAIRN_LEAK_CHECK_STATE"
}
# The tests' build first, on both cores: the lints and the fuzz build
# beside it would only slow it down (each is a build of the workspace).
timeout -k 60 2400 cargo test --workspace --locked --no-run
took "the tests' build"
# Without the run's mark: their processes are not the tests'.
env -u LEAK_CHECK_MARK -u CAIRN_LEAK_CHECK_STATE setsid scripts/lints-and-fuzz.sh >"$side_log" 2>&1 &
side=$!
leak_checked 3000 cargo test --workspace --locked
took "the workspace's tests"
# The same tests less the root tier (scripts/root-tier.txt), once more as
# uid 65534 without capabilities: what does not need root passes without it.
leak_checked 900 scripts/unprivileged-tests.sh
took "the unprivileged tier"
# The crash points once more on the cluster's store: each daemon on a fresh
# PostgreSQL database and a bucket of its own on the loopback S3 server.
# (`--workspace`, as above: the features the build had, so nothing is built again.)
CAIRN_TEST_STORE=postgres-s3 leak_checked 1200 cargo test --workspace --locked --test crash_points
took "the crash points on PostgreSQL + S3"
# The attack suite, the racing tests and the isolation, limits, egress, delivery, injection, ports and E2B SDK tests once
# more on the gvisor driver: their daemons give every task --isolation
# gvisor (runsc comes with setup-debian.sh).
CAIRN_TEST_ISOLATION=gvisor leak_checked 2400 cargo test --workspace --locked --test attack --test race --test isolation --test egress --test deliver --test inject --test ports --test e2b_sdk
took "the gvisor re-run"
# The lints and the fuzz run started beside the tests: their output, then
# their verdict.
side_rc=0
wait "$side" || side_rc=$?
cat "$side_log"
rm -f "$side_log"
if [ "$side_rc" -ne 0 ]; then
  echo "clippy or the fuzz run failed (exit $side_rc): see above" >&2
  exit "$side_rc"
fi
took "clippy and the fuzz run (beside the tests)"
