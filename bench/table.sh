#!/usr/bin/env bash
# Cairn's numbers in the format the open sandbox runtimes publish theirs:
# create (avg and p95 at 20 concurrent clients, creates a second), create
# from a snapshot, suspend and wake, 100 forks (fork base new and there),
# rollback in place, snapshot time against the size of the change (1, 10,
# 100 MB) and density (idle sandboxes beside a working one: exec p50,
# daemon and host memory per sandbox), on the native and gvisor drivers.
# Writes the "## Cairn in the format of the published tables" section of
# docs/benchmarks.md.
#
#   bench/table.sh                   # 1,000 idle native sandboxes, 100 gvisor
#   DENSITY=200 GVISOR_DENSITY=20 bench/table.sh
#   ISOLATIONS=native bench/table.sh # one driver only
#
# One daemon in a new home, the Python SDK in one process (the way an agent
# drives it). Needs root, runsc, busybox-static, the SDK (pip install
# ./sdk/python) and builds the release binary (a no-op when current).
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DENSITY=${DENSITY:-1000}
GVISOR_DENSITY=${GVISOR_DENSITY:-100}
ISOLATIONS=${ISOLATIONS:-native gvisor}
(cd "$ROOT" && cargo build --release --locked -q -p cairn-cli)
python3 -c 'import cairn' || { echo "the Python SDK is not installed: python3 -m pip install ./sdk/python" >&2; exit 1; }

WORK=$(mktemp -d /var/tmp/cairn-table.XXXXXX)
cp "$ROOT/target/release/cairn" "$WORK/cairn"
CAIRN=$WORK/cairn
export CAIRN_HOME=$WORK/home
DAEMON=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
cleanup() {
  if [[ -n $DAEMON ]]; then
    for id in $("$CAIRN" --json task list 2>/dev/null | python3 -c 'import json, sys; print(*(t["id"] for t in json.load(sys.stdin) if t["state"] != "destroyed"))'); do
      "$CAIRN" destroy "$id" >/dev/null 2>&1 || true
    done
    kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

busybox_rootfs "$WORK/rootfs"
for t in dd seq mkdir echo cat; do ln -sf busybox "$WORK/rootfs/bin/$t"; done
ulimit -n "$(ulimit -Hn)"
# A small reserve: a thousand 64 MiB task disks need most of the free space.
start_daemon --disk-reserve 1G
"$CAIRN" image import table "$WORK/rootfs" >/dev/null
for iso in $ISOLATIONS; do
  n=$DENSITY
  [[ $iso == gvisor ]] && n=$GVISOR_DENSITY
  echo "$iso: measuring (density $n)" >&2
  python3 "$ROOT/bench/table.py" "$iso" table "$DAEMON" "$n" "$WORK/$iso.json"
done
python3 "$ROOT/bench/table_report.py" "$ROOT/docs/benchmarks.md" "$WORK"/*.json
