#!/usr/bin/env bash
# Images: pull and unpack of a multi-layer image from a registry on loopback
# next to `skopeo copy` + `umoci unpack`; the disk 10 images sharing a base
# layer take next to 10 flattened copies; task create + first exec from a
# 1 GB image and from a template next to the host image; `fork --count 10`
# and `--count 100` from a task holding 200 MB. Writes the "## Images"
# section of docs/benchmarks.md.
#
#   bench/images.sh                 # 10 runs (RUNS=N), 5 for 100 forks (FORK100_RUNS=N)
#   SMALL=1 bench/images.sh         # every size ÷20, at most 3 runs: a quick check
#   CAIRN=/path/to/cairn bench/images.sh
#   DISK_POOL=N                     # the daemon's --disk-pool (default 4)
#
# Needs root, hyperfine, skopeo, docker-registry, umoci and busybox-static
# (installed with apt when missing), python3, and a release build of cairn
# (built when CAIRN is not given and target/release/cairn is missing).
# Everything it makes (registry, daemon home, layouts, bundles) lives in one
# directory under /var/tmp, removed at exit with the daemon's tasks.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"

SMALL=${SMALL:-0}
if [[ $SMALL == 1 ]]; then
  SCALE=20
  RUNS=${RUNS:-3}
  ((RUNS > 3)) && RUNS=3
  FORK100_RUNS=2
  WARMUP=1
else
  SCALE=1
  RUNS=${RUNS:-10}
  FORK100_RUNS=${FORK100_RUNS:-5}
  WARMUP=2
fi
((RUNS >= 2)) || { echo "images.sh: RUNS must be at least 2" >&2; exit 1; }
DISK_POOL=${DISK_POOL:-4}
# A size in bytes, shrunk in SMALL mode.
sz() { echo $(($1 / SCALE)); }

if [[ $(id -u) != 0 ]]; then
  echo "images.sh: run as root (the daemon builds namespaces, mounts and cgroups)" >&2
  exit 1
fi
need=()
for p in hyperfine:hyperfine skopeo:skopeo docker-registry:docker-registry busybox:busybox-static umoci:umoci; do
  command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null ||
    echo "images.sh: apt-get install ${need[*]} failed" >&2
fi
for c in hyperfine skopeo docker-registry busybox umoci python3; do
  if ! command -v "$c" >/dev/null; then
    echo "images.sh: $c is missing and could not be installed (umoci and the others are Debian packages: apt-get install umoci)" >&2
    exit 1
  fi
done

if [[ -z ${CAIRN:-} ]]; then
  CAIRN=$ROOT/target/release/cairn
  [[ -x $CAIRN ]] || (cd "$ROOT" && cargo build --release --locked -p cairn-cli)
fi
[[ -x $CAIRN ]] || { echo "images.sh: no cairn binary at $CAIRN" >&2; exit 1; }
export CAIRN

WORK=$(mktemp -d /var/tmp/cairn-bench-images.XXXXXX)
export CAIRN_HOME=$WORK/home
REGISTRY=
DAEMON=
cleanup() {
  set +e
  if [[ -n $DAEMON ]]; then
    # Every task of this (new) home: the forks, the sources, what a run left.
    "$CAIRN" --json task list 2>/dev/null |
      python3 -c 'import json, sys; [print(t.get("task", t)["id"]) for t in json.load(sys.stdin)]' 2>/dev/null |
      xargs -r -P 4 -n 1 "$CAIRN" destroy >/dev/null 2>&1
    kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  fi
  if [[ -n $REGISTRY ]]; then
    kill "$REGISTRY" 2>/dev/null && wait "$REGISTRY" 2>/dev/null
  fi
  # Nothing should be mounted or attached from here any more; if something
  # is (a daemon that died), it goes before the directory does.
  findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r | while read -r m; do umount -l "$m"; done
  losetup -a | grep -F "($WORK/" | cut -d: -f1 | while read -r l; do losetup -d "$l"; done
  rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }
# The JSON of a hyperfine run goes to $WORK/NAME.json.
bench() {
  local name=$1 runs=$2 warmup=$3
  shift 3
  hyperfine --style basic --runs "$runs" --warmup "$warmup" --export-json "$WORK/$name.json" "$@"
}

# ---------------------------------------------------------------------------
# The images, written as OCI layouts (gzip layers). All file contents are
# generated with fixed seeds, so every run has the same images.
say "writing the OCI layouts"
MB=1000000
# 1. ~100 MB in 4 layers of 5 files of 5 MB, half random, half text; the
#    bottom one also has busybox.
python3 "$ROOT/bench/oci_layout.py" "$WORK/big-oci" >"$WORK/big-layout.json" <<EOF
{"layers": {
  "l1": [{"kind": "busybox"}, {"kind": "files", "dir": "data/l1", "count": 5, "size": $(sz $((5 * MB))), "fill": "mixed", "seed": 1}],
  "l2": [{"kind": "files", "dir": "data/l2", "count": 5, "size": $(sz $((5 * MB))), "fill": "mixed", "seed": 2}],
  "l3": [{"kind": "files", "dir": "data/l3", "count": 5, "size": $(sz $((5 * MB))), "fill": "mixed", "seed": 3}],
  "l4": [{"kind": "files", "dir": "data/l4", "count": 5, "size": $(sz $((5 * MB))), "fill": "mixed", "seed": 4}]},
 "images": {"v1": ["l1", "l2", "l3", "l4"]}}
EOF
# 2. A ~50 MB base (busybox and 10 files of 5 MB) and 10 images t0..t9 on
#    it, each with its own ~1 MB top layer.
python3 - "$(sz $((5 * MB)))" "$(sz $MB)" >"$WORK/shared-spec.json" <<'PY'
import json, sys
base, top = int(sys.argv[1]), int(sys.argv[2])
layers = {"base": [{"kind": "busybox"}, {"kind": "files", "dir": "data/base", "count": 10, "size": base, "fill": "mixed", "seed": 10}]}
for i in range(10):
    layers[f"top{i}"] = [{"kind": "files", "dir": f"data/top{i}", "count": 1, "size": top, "fill": "mixed", "seed": 100 + i}]
print(json.dumps({"layers": layers, "images": {f"t{i}": ["base", f"top{i}"] for i in range(10)}}))
PY
python3 "$ROOT/bench/oci_layout.py" "$WORK/shared-oci" <"$WORK/shared-spec.json" >"$WORK/shared-layout.json"
# 3. ~1 GB in 4 layers of 2 files of 128 MiB (zeros with 64 KiB of random
#    bytes in each MiB: quick to make, every byte file data), busybox in the
#    bottom one; and `small`, the busybox layer alone.
python3 "$ROOT/bench/oci_layout.py" "$WORK/huge-oci" >"$WORK/huge-layout.json" <<EOF
{"layers": {
  "bb": [{"kind": "busybox"}],
  "h1": [{"kind": "files", "dir": "data/h1", "count": 2, "size": $(sz $((128 << 20))), "fill": "sparse", "seed": 21}],
  "h2": [{"kind": "files", "dir": "data/h2", "count": 2, "size": $(sz $((128 << 20))), "fill": "sparse", "seed": 22}],
  "h3": [{"kind": "files", "dir": "data/h3", "count": 2, "size": $(sz $((128 << 20))), "fill": "sparse", "seed": 23}],
  "h4": [{"kind": "files", "dir": "data/h4", "count": 2, "size": $(sz $((128 << 20))), "fill": "sparse", "seed": 24}]},
 "images": {"v1": ["bb", "h1", "h2", "h3", "h4"], "small": ["bb"]}}
EOF
python3 - "$WORK" <<'PY'
import json, sys
for name in ("big", "shared", "huge"):
    d = json.load(open(f"{sys.argv[1]}/{name}-layout.json"))
    ls = d["layers"].values()
    print(f"{name}: {len(ls)} layers, {sum(l['uncompressed'] for l in ls) / 1e6:.1f} MB of tar, "
          f"{sum(l['size'] for l in ls) / 1e6:.1f} MB gzipped, written in {d['seconds']} s")
PY

# ---------------------------------------------------------------------------
say "starting a registry on 127.0.0.1 and pushing the ~100 MB image"
mkdir -p "$WORK/registry"
cat >"$WORK/registry/config.yml" <<EOF
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $WORK/registry/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:0
EOF
setsid docker-registry serve "$WORK/registry/config.yml" >"$WORK/registry.log" 2>&1 </dev/null &
REGISTRY=$!
PORT=
for _ in $(seq 200); do
  PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$WORK/registry.log" | head -1 | sed 's/.*://') || true
  [[ -n $PORT ]] && break
  kill -0 "$REGISTRY" 2>/dev/null || break
  sleep 0.1
done
[[ -n $PORT ]] || { echo "images.sh: the registry did not start:" >&2; cat "$WORK/registry.log" >&2; exit 1; }
REF=127.0.0.1:$PORT/bench/big:v1
skopeo copy --quiet --insecure-policy --dest-tls-verify=false "oci:$WORK/big-oci:v1" "docker://$REF"
echo "pushed $REF"

start_daemon --disk-pool "$DISK_POOL"
"$CAIRN" task list >/dev/null || { echo "images.sh: the daemon did not start:" >&2; cat "$WORK/daemon.log" >&2; exit 1; }

# ---------------------------------------------------------------------------
say "1. pull + unpack: cairn image pull next to skopeo copy + umoci unpack"
# `image rm` of an OCI image removes the layers no other image uses, and a
# pull downloads every layer not in the layer store, so after it a pull
# downloads all four again; `cairn gc` is there too for good measure, and
# the prepare step fails if a layer of the image is still stored.
BIG_LAYERS=$(python3 -c 'import json, sys; print(" ".join(l["diff_id"].split(":")[1] for l in json.load(open(sys.argv[1]))["layers"].values()))' "$WORK/big-layout.json")
cat >"$WORK/pull-prepare.sh" <<SH
#!/bin/sh
"$CAIRN" image rm big-pull >/dev/null 2>&1
"$CAIRN" gc >/dev/null || exit 1
for l in $BIG_LAYERS; do
  if [ -e "$CAIRN_HOME/layers/sha256/\$l" ]; then echo "layer sha256:\$l is still stored: a pull would not download it" >&2; exit 1; fi
done
sync
SH
chmod +x "$WORK/pull-prepare.sh"
cp "$WORK/registry.log" "$WORK/registry-before-pull.log"
bench pull "$RUNS" "$WARMUP" \
  --prepare "$WORK/pull-prepare.sh" \
  -n "cairn image pull" "$CAIRN image pull --insecure $REF --name big-pull" \
  --prepare "rm -rf $WORK/skopeo-oci $WORK/bundle && sync" \
  -n "skopeo copy + umoci unpack" "skopeo copy --quiet --insecure-policy --src-tls-verify=false docker://$REF oci:$WORK/skopeo-oci:v1 && umoci unpack --image $WORK/skopeo-oci:v1 $WORK/bundle"
# What the registry served during the run: layer downloads by client.
python3 - "$WORK/registry.log" "$(wc -l <"$WORK/registry-before-pull.log")" "$BIG_LAYERS" "$WORK/big-layout.json" >"$WORK/served.json" <<'PY'
import json, re, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()[int(sys.argv[2]):]
digests = {l["digest"] for l in json.load(open(sys.argv[4]))["layers"].values()}
served = {"cairn": 0, "skopeo": 0, "other": 0}
for line in lines:
    # The access log: "GET /v2/bench/big/blobs/sha256:... HTTP/1.1" 200 SIZE "REFERER" "USER-AGENT"
    m = re.search(r'"GET /v2/bench/big/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (\d+) \d+ "[^"]*" "([^"]*)"', line)
    if not m or m.group(1) not in digests or m.group(2) != "200":
        continue
    agent = m.group(3).lower()
    served["skopeo" if "skopeo" in agent or "containers" in agent else "cairn" if "oci-client" in agent or "cairn" in agent else "other"] += 1
print(json.dumps(served))
PY
echo "layer downloads the registry served: $(cat "$WORK/served.json")"
"$CAIRN" image rm big-pull >/dev/null 2>&1 || true
rm -rf "$WORK/skopeo-oci" "$WORK/bundle"
"$CAIRN" gc >/dev/null

# ---------------------------------------------------------------------------
say "2. disk: 10 images sharing a base layer, next to 10 flattened copies"
for i in $(seq 0 9); do
  "$CAIRN" image import "shared-$i" "$WORK/shared-oci" --tag "t$i" >/dev/null
done
LAYERS_STORED=$(find "$CAIRN_HOME/layers/sha256" -mindepth 1 -maxdepth 1 -type d | wc -l)
STORE_BYTES=$(du -sb "$CAIRN_HOME/layers" | cut -f1)
IMAGE_DIR_BYTES=$(du -sbc "$CAIRN_HOME"/images/shared-* | tail -1 | cut -f1)
mkdir -p "$WORK/flat"
FLAT_BYTES=0
for i in $(seq 0 9); do
  umoci unpack --image "$WORK/shared-oci:t$i" "$WORK/flat/t$i" >/dev/null
  FLAT_BYTES=$((FLAT_BYTES + $(du -sb "$WORK/flat/t$i/rootfs" | cut -f1)))
done
rm -rf "$WORK/flat"
for i in $(seq 0 9); do "$CAIRN" image rm "shared-$i" >/dev/null; done
echo "{\"layers_stored\": $LAYERS_STORED, \"store_bytes\": $STORE_BYTES, \"image_dir_bytes\": $IMAGE_DIR_BYTES, \"flat_bytes\": $FLAT_BYTES}" >"$WORK/disk.json"
cat "$WORK/disk.json"

# ---------------------------------------------------------------------------
say "3. task create + first exec: host, a template, a 1 GB image, a small image"
"$CAIRN" image import huge "$WORK/huge-oci" --tag v1
"$CAIRN" image import small "$WORK/huge-oci" --tag small
# The template: a task on the host image (the default) that wrote ~50 MB,
# committed.
T=$("$CAIRN" task create)
"$CAIRN" exec "$T" -- sh -c "mkdir -p /workspace/prepared && for i in 0 1 2 3 4; do head -c $(sz $((10 * MB))) /dev/urandom >/workspace/prepared/f\$i; done"
"$CAIRN" image commit "$T" prepared
"$CAIRN" destroy "$T" >/dev/null
destroy_created_script
create() { echo "id=\$($CAIRN task create $1) && echo \$id >>$WORK/created && $CAIRN exec \$id -- /bin/true"; }
bench create "$RUNS" "$WARMUP" --prepare "$WORK/destroy-created.sh" \
  -n "host" "$(create '--image host')" \
  -n "template" "$(create '--image prepared')" \
  -n "1 GB image" "$(create '--image huge')" \
  -n "small image" "$(create '--image small')"
"$WORK/destroy-created.sh"
HUGE_BYTES=$("$CAIRN" --json image inspect huge | python3 -c 'import json, sys; print(json.load(sys.stdin)["size_bytes"])')
PREPARED_BYTES=$("$CAIRN" --json image inspect prepared | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(sum(l.get("size_bytes", 0) for l in d.get("layer_details", []) if l.get("media_type") == "application/vnd.cairn.committed-layer"))')
echo "{\"huge_bytes\": $HUGE_BYTES, \"prepared_bytes\": $PREPARED_BYTES}" >"$WORK/create-sizes.json"
cat "$WORK/create-sizes.json"

# ---------------------------------------------------------------------------
say "4. forks of a task holding 200 MB"
SRC=$("$CAIRN" task create --name fork-source)
"$CAIRN" exec "$SRC" -- sh -c "mkdir -p /workspace/data && for i in \$(seq 0 19); do head -c $(sz $((10 * MB))) /dev/urandom >/workspace/data/f\$i; done"
"$CAIRN" snapshot "$SRC" --note "the forks' source" >/dev/null
SRC_BYTES=$("$CAIRN" --json snapshot list "$SRC" | python3 -c 'import json, sys; print(max(s["bytes"] for s in json.load(sys.stdin)))')
# Destroying a snapshot's last fork removes the hidden base its forks share,
# so with no other fork alive each run makes it again (restoring the
# snapshot into the layer store once); the prepare step checks that it is
# gone. The "base already made" runs keep one fork alive meanwhile.
cat >"$WORK/fork-prepare-cold.sh" <<SH
#!/bin/sh
"$WORK/destroy-created.sh"
if ls -d "$CAIRN_HOME"/images/.fork-* >/dev/null 2>&1; then echo "a fork base is still there" >&2; exit 1; fi
SH
cat >"$WORK/fork-prepare-warm.sh" <<SH
#!/bin/sh
"$WORK/destroy-created.sh"
ls -d "$CAIRN_HOME"/images/.fork-* >/dev/null 2>&1 || { echo "the fork base is gone" >&2; exit 1; }
SH
chmod +x "$WORK"/fork-prepare-*.sh
fork() { echo "$CAIRN fork $SRC --count $1 >>$WORK/created"; }
bench fork10-cold "$RUNS" "$WARMUP" --prepare "$WORK/fork-prepare-cold.sh" -n "fork --count 10" "$(fork 10)"
bench fork100-cold "$FORK100_RUNS" 1 --prepare "$WORK/fork-prepare-cold.sh" -n "fork --count 100" "$(fork 100)"
"$WORK/destroy-created.sh"
KEEP=$("$CAIRN" fork "$SRC" --count 1)
bench fork10-warm "$RUNS" "$WARMUP" --prepare "$WORK/fork-prepare-warm.sh" -n "fork --count 10, base kept" "$(fork 10)"
bench fork100-warm "$FORK100_RUNS" 1 --prepare "$WORK/fork-prepare-warm.sh" -n "fork --count 100, base kept" "$(fork 100)"
"$WORK/destroy-created.sh"
"$CAIRN" destroy "$KEEP" >/dev/null
echo "{\"source_bytes\": $((20 * $(sz $((10 * MB))))), \"snapshot_bytes\": $SRC_BYTES}" >"$WORK/fork-sizes.json"

# ---------------------------------------------------------------------------
say "writing docs/benchmarks.md"
{
  echo "{\"small\": $SMALL, \"scale\": $SCALE, \"runs\": $RUNS, \"fork100_runs\": $FORK100_RUNS, \"warmup\": $WARMUP, \"disk_pool\": $DISK_POOL,"
  echo " \"commit\": \"$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)\","
  echo " \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\","
  echo " \"skopeo\": \"$(skopeo --version | head -1)\","
  echo " \"umoci\": \"$(umoci --version | head -1)\","
  echo " \"registry\": \"$(docker-registry --version 2>&1 | head -1)\","
  echo " \"hyperfine\": \"$(hyperfine --version | head -1)\"}"
} >"$WORK/meta.json"
python3 "$ROOT/bench/images_report.py" "$WORK" "$ROOT/docs/benchmarks.md"
