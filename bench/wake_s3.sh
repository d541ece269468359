#!/usr/bin/env bash
# Wake latency with the blob store on S3-compatible storage (moto's server on
# loopback), with the node's pack cache cold and warm, next to the local
# blob store in the same run. Each wake restores the workspace from the blob
# store onto a new disk (the suspended task's disk image is removed first, as
# on a node that did not suspend it); "cold" also empties the pack cache.
# Plus the cached-disk wake (nothing restored) for reference.
#
#   bench/wake_s3.sh               # prints the markdown section
#   bench/wake_s3.sh --write-docs  # ... and puts it into docs/benchmarks.md
#   WAKES=5                        # wakes per size and mode
#
# Needs root, python3 with moto[server] (installed when missing) and a
# release build of cairn (built when missing).
set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WAKES=${WAKES:-5}
DOC=
for a in "$@"; do
  case $a in
    --write-docs) DOC=$ROOT/docs/benchmarks.md ;;
    *) echo "usage: $0 [--write-docs]" >&2; exit 2 ;;
  esac
done
python3 -c 'import moto.server, boto3' 2>/dev/null || python3 -m pip install -q 'moto[server]' 2>/dev/null \
  || python3 -m pip install -q --break-system-packages 'moto[server]'
(cd "$ROOT" && cargo build --release --locked -q -p cairn-cli)  # a no-op when the build is current

WORK=$(mktemp -d /var/tmp/cairn-wake-s3.XXXXXX)
cp "$ROOT/target/release/cairn" "$WORK/cairn"
CAIRN=$WORK/cairn
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
DAEMON= MOTO= TASKS=()
stop_daemon() {
  for t in "${TASKS[@]}"; do "$CAIRN" destroy "$t" >/dev/null 2>&1 || true; done
  TASKS=()
  [[ -n $DAEMON ]] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
  DAEMON=
}
cleanup() {
  stop_daemon
  [[ -n $MOTO ]] && kill "$MOTO" 2>/dev/null && wait "$MOTO" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m moto.server -H 127.0.0.1 -p "$PORT" >"$WORK/moto.log" 2>&1 &
MOTO=$!
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 AWS_ALLOW_HTTP=true
for _ in $(seq 100); do curl -s -o /dev/null "$AWS_ENDPOINT_URL" && break; sleep 0.1; done
python3 -c 'import boto3; boto3.client("s3").create_bucket(Bucket="bench")'

start_daemon() { # home [args]
  export CAIRN_HOME=$1
  shift
  setsid "$CAIRN" serve --listen 127.0.0.1:0 "$@" >>"$WORK/daemon.log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 100); do [[ -s $CAIRN_HOME/url ]] && "$CAIRN" task list >/dev/null 2>&1 && break; sleep 0.1; done
}

last_wake() { # task -> {"ms": daemon duration, "from_cache": ...}
  "$CAIRN" --json log "$1" | python3 -c '
import json, sys
w = [e for e in json.load(sys.stdin) if e["kind"] == "wake"][-1]
print(json.dumps({"daemon_ms": w["duration_ms"], "from_cache": w["args"].get("from_cache")}))'
}

# measure STORE SIZE_MB: one task with SIZE_MB of files, WAKES wakes per mode.
measure() {
  local store=$1 mb=$2 t mode i a b
  t=$("$CAIRN" task create --disk 1G)
  TASKS+=("$t")
  "$CAIRN" exec "$t" -- sh -c "mkdir -p /workspace/w && i=0; while [ \$i -lt $mb ]; do head -c 1048576 /dev/urandom > /workspace/w/f\$i; i=\$((i+1)); done" >/dev/null
  "$CAIRN" wait "$t" --webhook go >/dev/null
  for mode in disk store cold; do
    [[ $store == local && $mode == cold ]] && continue
    for i in $(seq "$WAKES"); do
      case $mode in
        store) rm -f "$CAIRN_HOME/disks/$t.img" ;;
        cold) rm -f "$CAIRN_HOME/disks/$t.img"; rm -rf "$CAIRN_HOME/blob-cache/packs" ;;
      esac
      a=${EPOCHREALTIME/./}
      "$CAIRN" event "$t" --name go >/dev/null
      "$CAIRN" exec "$t" -- true >/dev/null
      b=${EPOCHREALTIME/./}
      printf '{"store": "%s", "mb": %s, "mode": "%s", "client_ms": %s, "wake": %s}\n' \
        "$store" "$mb" "$mode" "$(((b - a) / 1000))" "$(last_wake "$t")" >>"$RESULTS"
      "$CAIRN" exec "$t" -- sh -c "head -c 4096 /dev/urandom >> /workspace/w/step" >/dev/null
      "$CAIRN" wait "$t" --webhook go >/dev/null
    done
  done
}

for store in local s3; do
  echo "blob store: $store" >&2
  if [[ $store == local ]]; then start_daemon "$WORK/home-local"; else start_daemon "$WORK/home-s3" --blob s3://bench/cairn; fi
  for mb in 10 200; do measure "$store" "$mb"; done
  stop_daemon
done

python3 - "$RESULTS" "$WAKES" "${DOC:-}" "$ROOT" <<'PY'
import datetime, json, os, platform, statistics, subprocess, sys
sys.path.insert(0, os.path.join(sys.argv[4], "bench"))
from machine import cpu_model, mem_total
res = [json.loads(l) for l in open(sys.argv[1])]
wakes, doc, root = sys.argv[2], sys.argv[3], sys.argv[4]
commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
moto = subprocess.run(["python3", "-c", "import moto; print(moto.__version__)"], capture_output=True, text=True).stdout.strip()
def rows(store, mb, mode):
    return [r for r in res if r["store"] == store and r["mb"] == mb and r["mode"] == mode]
def ms(x):
    return f"{x:,.0f} ms" if x >= 10 else f"{x:.1f} ms"
names = {"disk": "the task's disk kept (nothing restored)", "store": "restored from the blob store, pack cache warm",
         "cold": "restored from the blob store, pack cache empty"}
out = ["## Wake from S3-compatible storage", "",
       "A suspended task woken by `cairn event` (then `cairn exec ID -- true`), its blob store a",
       "local directory (the default) or a bucket on S3-compatible storage (`--blob s3://bench/cairn`,",
       f"moto {moto} on loopback), in one run (`bench/wake_s3.sh`, {wakes} wakes per line). A wake",
       "from the blob store is what a node that did not suspend the task does: the disk image is",
       "removed before the event, so every file is restored onto a new disk; \"cache empty\" also",
       "removes the node's pack cache (`<home>/blob-cache`), so every pack is downloaded again.",
       "Daemon: the `wake` event's duration (event accepted to sandbox ready); client: from",
       "`cairn event` to the end of the first exec.", "",
       f"- date: {datetime.date.today()}",
       f"- machine: {os.cpu_count()} cores, {cpu_model()}, {mem_total()}, kernel {platform.release()}",
       f"- commit: {commit}; load average at the end: {os.getloadavg()[0]:.2f}", "",
       "| workspace | blob store | wake | daemon p50 | max | client p50 | vs local store |",
       "|---|---|---|---:|---:|---:|---:|"]
for mb in (10, 200):
    base = statistics.median(r["wake"]["daemon_ms"] for r in rows("local", mb, "store"))
    for store, mode in (("local", "disk"), ("local", "store"), ("s3", "disk"), ("s3", "store"), ("s3", "cold")):
        rs = rows(store, mb, mode)
        d = [r["wake"]["daemon_ms"] for r in rs]
        c = [r["client_ms"] for r in rs]
        ratio = f"{statistics.median(d) / base:.2f}×" if mode != "disk" else ""
        name = "restored from the blob store" if (store, mode) == ("local", "store") else names[mode]
        out.append(f"| {mb} MB | {'local directory' if store == 'local' else 'S3 (moto)'} | {name} | "
                   f"{ms(statistics.median(d))} | {ms(max(d))} | {ms(statistics.median(c))} | {ratio} |")
out += ["", "With the cache warm a wake downloads nothing: the packs this node wrote when it suspended",
        "the task went into its cache as they were uploaded. With it empty, the restore first fetches",
        "the packs it needs, 8 at a time, then writes the files. A warm wake from S3 can beat the",
        "local store: before writing, a restore from a remote store reads its packs into the cache",
        "8 at a time, while a local store is read pack by pack as the files are written.", ""]
section = "\n".join(out)
print(section)
if doc:
    text = open(doc).read()
    start = text.find("\n## Wake from S3-compatible storage\n")
    if start >= 0:
        nxt = text.find("\n## ", start + 1)
        text = text[:start + 1] + section + (text[nxt:] if nxt >= 0 else "\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(doc, "w").write(text)
PY
