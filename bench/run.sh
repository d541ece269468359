#!/usr/bin/env bash
# Sandbox start-up benchmark: cairn (task create + first exec, and a warm
# exec) against bwrap and runc running /bin/true in the same busybox rootfs,
# side by side in one hyperfine run. Writes docs/benchmarks.md.
#
#   bench/run.sh            # 50 runs each (RUNS=N to change)
#
# Needs root, hyperfine, bubblewrap, runc and busybox-static (installed when
# missing) and a release build of cairn (built when missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
RUNS=${RUNS:-50}
CAIRN=$ROOT/target/release/cairn

need=()
for p in hyperfine:hyperfine bwrap:bubblewrap runc:runc busybox:busybox-static; do
  command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if ((${#need[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[[ -x $CAIRN ]] || (cd "$ROOT" && cargo build --release -p cairn-cli)

WORK=$(mktemp -d /var/tmp/cairn-bench.XXXXXX)
export CAIRN_HOME=$WORK/home
cleanup() {
  if [[ -f $WORK/created ]]; then
    while read -r id; do "$CAIRN" destroy "$id" >/dev/null 2>&1 || true; done <"$WORK/created"
  fi
  [[ -n ${WARM:-} ]] && "$CAIRN" destroy "$WARM" >/dev/null 2>&1 || true
  [[ -n ${DAEMON:-} ]] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# One rootfs for all three: a static busybox.
busybox_rootfs "$WORK/rootfs"

# runc bundle of the same rootfs.
mkdir -p "$WORK/bundle"
cp -a "$WORK/rootfs" "$WORK/bundle/rootfs"
(cd "$WORK/bundle" && runc spec)
python3 - "$WORK/bundle/config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["process"]["terminal"] = False
c["process"]["args"] = ["/bin/true"]
json.dump(c, open(p, "w"))
PY

start_daemon --disk-pool 4
"$CAIRN" image import bench "$WORK/rootfs" >/dev/null
WARM=$("$CAIRN" task create --image bench)
destroy_created_script

hyperfine --style basic --warmup 5 --runs "$RUNS" --export-json "$WORK/results.json" \
  --prepare "$WORK/destroy-created.sh" \
  -n "cairn task create + first exec" \
  "id=\$($CAIRN task create --image bench) && echo \$id >>$WORK/created && $CAIRN exec \$id -- /bin/true" \
  -n "cairn exec (warm)" "$CAIRN exec $WARM -- /bin/true" \
  -n "bwrap --unshare-all" "bwrap --unshare-all --bind $WORK/rootfs / --proc /proc --dev /dev /bin/true" \
  -n "runc run" "runc run -b $WORK/bundle cairn-bench"

python3 "$ROOT/bench/report.py" "$WORK/results.json" "$RUNS" >"$WORK/startup.md"
# The start-up part is the top of the document; the sections other
# benchmarks write (## ...) stay as they are.
python3 - "$WORK/startup.md" "$ROOT/docs/benchmarks.md" <<'PY'
import sys, os
new = open(sys.argv[1]).read().rstrip("\n") + "\n"
doc = sys.argv[2]
old = open(doc).read() if os.path.exists(doc) else ""
i = old.find("\n## ")
open(doc, "w").write(new + (old[i:] if i >= 0 else ""))
PY
echo "wrote docs/benchmarks.md"
