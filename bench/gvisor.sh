#!/usr/bin/env bash
# gvisor driver benchmark: suspend and wake latency of gvisor tasks whose
# service holds 10 MB and 200 MB of memory (random bytes, which the
# checkpoint cannot skip), next to the native driver's on the same
# workspace (whose suspend drops the service, and whose wake starts it
# again), and to runsc checkpoint and restore alone on a plain runsc
# sandbox holding the same memory.
#
#   bench/gvisor.sh                # prints the markdown section
#   bench/gvisor.sh --write-docs   # ... and puts it into docs/benchmarks.md
#   ROUNDS=5                       # suspend/wake cycles per driver and size
#   RAW=FILE                       # keep every measurement (JSON lines)
#
# One daemon in a new home. Each cycle: `cairn suspend ID` (timed by the
# client; the suspend snapshot's checkpoint time from its event), then
# `cairn resume ID` (timed by the client; the wake's own `sandbox_ready_ms`
# from its event). Needs root, runsc and python3 (installed when missing)
# and builds the release binary (a no-op when current).
set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-5}
WRITE_DOCS=()
for a in "$@"; do
  case $a in
    --write-docs) WRITE_DOCS=(--write-docs "$ROOT/docs/benchmarks.md") ;;
    *) echo "usage: $0 [--write-docs]" >&2; exit 2 ;;
  esac
done

need=()
for p in runsc:runsc python3:python3; do
  command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if ((${#need[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
(cd "$ROOT" && cargo build --release --locked -q -p cairn-cli)

WORK=$(mktemp -d /var/tmp/cairn-gvbench.XXXXXX)
cp "$ROOT/target/release/cairn" "$WORK/cairn"
CAIRN=$WORK/cairn
export CAIRN_HOME=$WORK/home
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
: >"$WORK/created"
DAEMON=
RAW_ID=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
RUNSC=(runsc --root "$WORK/runsc-state" --platform=ptrace --network=none)
cleanup() {
  if [[ -s $WORK/created ]]; then
    xargs -I{} "$CAIRN" destroy {} <"$WORK/created" >/dev/null 2>&1 || true
  fi
  if [[ -n $RAW_ID ]]; then "${RUNSC[@]}" delete -force "$RAW_ID" >/dev/null 2>&1 || true; fi
  if [[ -n $DAEMON ]]; then kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true; fi
  if [[ -n ${RAW:-} ]]; then cp "$RESULTS" "$RAW"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stamp() { printf -v "$1" '%s' "${EPOCHREALTIME/./}"; } # microseconds
rec() { printf '{"g": "%s", "k": "%s", "v": %s}\n' "$1" "$2" "$3" >>"$RESULTS"; }
last_event() { # task kind key: that key of the task's last event of that kind
  "$CAIRN" --json log "$1" | python3 -c 'import json, sys
ev = [e for e in json.load(sys.stdin) if e["kind"] == sys.argv[1]]
v = ev[-1]["args"]
for k in sys.argv[2].split("."):
    v = v[k]
print(v)' "$2" "$3"
}

# A service that holds MB megabytes of random bytes and ticks a counter.
holder() {
  echo "python3 -c 'import os, time
b = os.urandom($1 << 20)
i = 0
while True:
    i += 1
    open(\"/workspace/tick\", \"w\").write(str(i))
    time.sleep(0.1)'"
}

start_daemon --disk-pool 2
for mb in 10 200; do
  for driver in gvisor native; do
    id=$("$CAIRN" --json task create --isolation "$driver" --memory 1G --service "$(holder "$mb")" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
    echo "$id" >>"$WORK/created"
    # The same workspace for both: 8 MB in 8 files.
    "$CAIRN" exec "$id" -- sh -c 'for i in 1 2 3 4 5 6 7 8; do head -c 1048576 /dev/urandom > /workspace/f$i; done'
    until "$CAIRN" exec "$id" -- test -s /workspace/tick; do sleep 0.2; done
    sleep 1
    for _ in $(seq "$ROUNDS"); do
      stamp t0; "$CAIRN" suspend "$id" >/dev/null; stamp t1
      rec "$driver-$mb" suspend_ms "$(((t1 - t0) / 1000))"
      if [[ $driver == gvisor ]]; then
        rec "$driver-$mb" checkpoint_ms "$(last_event "$id" snapshot checkpoint_ms)"
        rec "$driver-$mb" image_bytes "$("$CAIRN" --json snapshot list "$id" | python3 -c 'import json, sys; print(json.load(sys.stdin)[-1]["bytes"])')"
      fi
      stamp t0; "$CAIRN" resume "$id" >/dev/null; stamp t1
      rec "$driver-$mb" wake_ms "$(((t1 - t0) / 1000))"
      rec "$driver-$mb" ready_ms "$(last_event "$id" wake sandbox_ready_ms)"
      rec "$driver-$mb" resumed "$(last_event "$id" wake resumed_processes | tr A-Z a-z)"
      sleep 1
    done
    "$CAIRN" destroy "$id" >/dev/null
  done
done

# runsc alone: the host's root read-only, the same holder, checkpoint and
# restore into the same bundle.
mkdir -p "$WORK/bundle" "$WORK/runsc-state"
for mb in 10 200; do
  RAW_ID=gvbench$mb
  python3 - "$WORK/bundle/config.json" "$mb" <<'PY'
import json, sys
mb = int(sys.argv[2])
code = f"import os, time\nb = os.urandom({mb} << 20)\nwhile True: time.sleep(0.1)"
spec = {
    "ociVersion": "1.0.2",
    "root": {"path": "/", "readonly": True},
    "process": {"args": ["python3", "-c", code], "env": ["PATH=/usr/bin:/bin"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
    "hostname": "bench",
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}, {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}],
    "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
}
json.dump(spec, open(sys.argv[1], "w"))
PY
  "${RUNSC[@]}" run -detach -bundle "$WORK/bundle" "$RAW_ID" >"$WORK/raw.log" 2>&1
  sleep 2
  for _ in $(seq "$ROUNDS"); do
    rm -rf "$WORK/image" && mkdir "$WORK/image"
    stamp t0; "${RUNSC[@]}" checkpoint -image-path "$WORK/image" "$RAW_ID" >/dev/null 2>&1; stamp t1
    rec "runsc-$mb" checkpoint_ms "$(((t1 - t0) / 1000))"
    rec "runsc-$mb" image_bytes "$(stat -c %s "$WORK/image/checkpoint.img")"
    "${RUNSC[@]}" delete -force "$RAW_ID" >/dev/null 2>&1 || true
    stamp t0; "${RUNSC[@]}" restore -detach -bundle "$WORK/bundle" -image-path "$WORK/image" "$RAW_ID" >"$WORK/raw.log" 2>&1; stamp t1
    rec "runsc-$mb" restore_ms "$(((t1 - t0) / 1000))"
    sleep 1
  done
  "${RUNSC[@]}" delete -force "$RAW_ID" >/dev/null 2>&1 || true
  RAW_ID=
done

python3 "$ROOT/bench/gvisor_report.py" "$RESULTS" "$ROUNDS" "${WRITE_DOCS[@]}"
