#!/usr/bin/env bash
# Tests scripts/leak-check.sh (as root): takes a reading, makes one thing
# of each kind (a tmpfs mount, a loop device, a cgroup, a sleeping process,
# a named network namespace, listening TCP and unix sockets, a
# /var/tmp/cairn-* file), and requires `after` to exit 1 naming each one,
# grouped by kind, and not a process that ended within the grace period;
# then removes them all and requires `after` to exit 0 (the positive
# control), again with a short-lived process running when it starts.
# Whatever it made is removed on every exit.
#
# It runs in pid, mount and network namespaces of its own, with private
# /var/tmp and /run, so that other work on the host (builds, other
# test runs) does not show up in its readings; loop devices and cgroups
# stay the host's. LEAK_CHECK_TEST_ON_HOST=1 runs it without them, which
# needs a quiet host.
set -euo pipefail
cd "$(dirname "$0")/.."
check=$PWD/scripts/leak-check.sh
name=cairn-leakcheck-test

[[ $(id -u) == 0 ]] || { echo "leak-check-test: must run as root" >&2; exit 2; }
for tool in unshare mount umount losetup ip python3 timeout; do
  command -v "$tool" >/dev/null || { echo "leak-check-test: required tool '$tool' is missing" >&2; exit 2; }
done

if [[ -z ${LEAK_CHECK_TEST_ON_HOST:-} && -z ${LEAK_CHECK_TEST_INSIDE:-} ]]; then
  exec unshare --pid --fork --kill-child=TERM --mount-proc --mount --propagation private --net \
    env LEAK_CHECK_TEST_INSIDE=1 "$0" "$@"
fi
if [[ -n ${LEAK_CHECK_TEST_INSIDE:-} ]]; then
  mount -t tmpfs leakcheck-var-tmp /var/tmp
  mount -t tmpfs leakcheck-run /run
  mkdir /run/netns
  ip link set lo up
fi

tmp=$(mktemp -d /tmp/cairn-leakcheck-test.XXXXXX)
state=$tmp/state
cgroup=
loop=
pids=()
netns=
mnt=

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  [[ -z $mnt ]] || umount "$mnt" 2>/dev/null || true
  [[ -z $loop ]] || losetup -d "$loop" 2>/dev/null || true
  [[ -z $cgroup ]] || rmdir "$cgroup" 2>/dev/null || true
  [[ -z $netns ]] || ip netns del "$netns" 2>/dev/null || true
  rm -f "/var/tmp/$name"
  mnt= loop= cgroup= netns=
}
trap 'cleanup; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP

fail() {
  echo "leak-check-test: FAIL: $*" >&2
  [[ -z ${out:-} ]] || printf 'leak-check.sh after printed:\n%s\n' "$out" >&2
  exit 1
}
expect_line() {
  grep -qE -- "$1" <<<"$out" || fail "no line matching '$1'"
}

# No reading yet: an error, not a clean bill.
rc=0
timeout 60 "$check" after "$state" >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "after without before exited $rc, not 2"

# The processes this test starts carry the mark, as a test run's do.
export LEAK_CHECK_MARK=leak-check-test-$$
timeout 60 "$check" before "$state" >/dev/null

# One of each kind.
mnt=$tmp/mnt
mkdir "$mnt"
mount -t tmpfs "$name" "$mnt"
truncate -s 1M "$tmp/disk"
loop=$(losetup --find --show "$tmp/disk")
root=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break; if ($(i + 1) ~ /^cgroup2?$/) { print $5; exit } }' /proc/self/mountinfo)
[[ -n $root ]] || fail "no cgroup hierarchy is mounted"
cgroup=$root/$name
mkdir "$cgroup"
sleep 1000 &
pids+=($!)
sleeper=$!
python3 -c '
import os, socket, sys, time
t = socket.socket(); t.bind(("127.0.0.1", 0)); t.listen()
u = socket.socket(socket.AF_UNIX); u.bind(sys.argv[1]); u.listen()
with open(sys.argv[2] + ".new", "w") as f: f.write(str(t.getsockname()[1]))
os.rename(sys.argv[2] + ".new", sys.argv[2])
time.sleep(1000)
' "$tmp/sock" "$tmp/port" &
pids+=($!)
listener=$!
for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.1; done
[[ -s $tmp/port ]] || fail "the listener did not start"
port=$(<"$tmp/port")
netns=$name
ip netns add "$netns"
echo leftover >"/var/tmp/$name"
# Other work on the host (no mark, no cgroup or name of Cairn's): not the
# check's.
env -u LEAK_CHECK_MARK sleep 1000 &
pids+=($!)
unmarked=$!
# Ends within the grace period: not a leak.
sleep 2 &
pids+=($!)
brief=$!

rc=0
out=$(timeout 60 "$check" after "$state" 2>&1) || rc=$?
[[ $rc == 1 ]] || fail "after exited $rc with one of each kind left, not 1"
expect_line "^leak: mount $mnt tmpfs $name\$"
expect_line "^leak: loop $loop $tmp/disk\$"
expect_line "^leak: cgroup $cgroup\$"
expect_line "^leak: process $sleeper sleep .*: sleep 1000\$"
expect_line "^leak: process $listener python3 "
expect_line "^leak: netns $name \\(named"
expect_line "^leak: socket tcp LISTEN 127\\.0\\.0\\.1:$port "
expect_line "^leak: socket u_str LISTEN $tmp/sock "
expect_line "^leak: file /var/tmp/$name\$"
expect_line "^leak-check: [0-9]+ new things since "
! grep -qE "^leak: process $brief " <<<"$out" || fail "a process that ended within the grace period was named"
! grep -qE "^leak: process $unmarked " <<<"$out" || fail "a process without the run's mark was named"
! grep -q "$state" <<<"$out" || fail "the state directory was named"
# Grouped by kind: each kind in one run of lines.
repeated=$(grep '^leak: ' <<<"$out" | awk '{ print $2 }' | uniq | sort | uniq -d)
[[ -z $repeated ]] || fail "kinds not grouped: $repeated"

# The positive control: all gone, and a process that ends within the grace.
# Loop devices and cgroups are the host's even here: when every line is
# one of those and none is this test's, it is another run's on the same
# host, and the check is taken again (for up to 60 s).
cleanup
sleep 1 &
pids+=($!)
for attempt in $(seq 12); do
  rc=0
  out=$(timeout 60 "$check" after "$state" 2>&1) || rc=$?
  [[ $rc == 1 ]] || break
  others=$(grep '^leak: ' <<<"$out" | grep -vE "^leak: (loop|cgroup) " || true)
  ours=$(grep -E "$name|$tmp" <<<"$out" || true)
  [[ -z $others && -z $ours ]] || break
  echo "leak-check-test: loop devices or cgroups of other work on this host (attempt $attempt), taking the check again:" >&2
  grep '^leak: ' <<<"$out" >&2
done
[[ $rc == 0 ]] || fail "after exited $rc with everything removed, not 0"
expect_line "^leak-check: nothing new since "
echo "leak-check-test: ok (each kind named, nothing new once removed)"
