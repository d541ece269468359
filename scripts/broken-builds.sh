#!/usr/bin/env bash
# Shows that the suite fails on deliberate regressions (docs/testing.md):
# each patch in scripts/broken/ (a leaked mount, a wrong errno, a crash point
# that loses an event) is applied to a scratch worktree of HEAD, the whole
# suite runs there, and this script fails unless every broken build fails
# the suite. Run by hand, as root, after scripts/setup-debian.sh; it takes
# about three full test runs.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
scratch=${CAIRN_BROKEN_DIR:-$repo/target/broken-builds}
export CARGO_TARGET_DIR=$scratch/target
mkdir -p "$scratch"
git worktree remove --force "$scratch/src" 2>/dev/null || true
git worktree add --quiet --detach "$scratch/src" HEAD
trap 'git -C "$repo" worktree remove --force "$scratch/src"' EXIT
# A broken build leaks on purpose: after each run, what the test homes
# left (mounts, loop devices, the homes) goes, so the next run and the host
# start clean. Do not run this beside another test run.
clean_leaks() {
    grep -oE ' /var/tmp/cairn-(test|demo)-[^ ]*' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" || true; done
    losetup -l -n -O NAME,BACK-FILE | awk '$2 ~ "^/var/tmp/cairn-(test|demo)-" {print $1}' | while read -r dev; do losetup -d "$dev" || true; done
    rm -rf /var/tmp/cairn-test-* /var/tmp/cairn-demo-*
}
status=0
for patch in "$repo"/scripts/broken/*.patch; do
    name=$(basename "$patch" .patch)
    log=$scratch/$name.log
    git -C "$scratch/src" checkout --quiet .
    git -C "$scratch/src" apply "$patch"
    echo "$name: running the suite on the broken build (log: $log)"
    if (cd "$scratch/src" && cargo test --workspace --locked --no-fail-fast) >"$log" 2>&1; then
        echo "$name: the suite PASSED on a broken build"
        status=1
    else
        echo "$name: the suite failed, as it must; failing tests:"
        awk '/^failures:$/ {f = 1; next} /^test result:/ {f = 0} f && /^    [A-Za-z0-9_:]+$/ {print "  " $1}' "$log" | sort -u
    fi
    clean_leaks
done
exit $status
