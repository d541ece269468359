#!/usr/bin/env bash
# The Python SDK next to the CLI: a warm exec and a create + first exec,
# each as a new process per call (hyperfine, side by side in one run), and
# in one long-lived Python process (the way an agent uses the SDK).
# Writes the "## Python SDK" section of docs/benchmarks.md.
#
#   bench/sdk.sh            # 30 runs each (RUNS=N to change)
#
# Needs root, hyperfine, busybox-static, the SDK (pip install ./sdk/python)
# and a release build of cairn (built when missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
RUNS=${RUNS:-30}
CAIRN=$ROOT/target/release/cairn
[[ -x $CAIRN ]] || (cd "$ROOT" && cargo build --release --locked -p cairn-cli)
python3 -c 'import cairn' || { echo "the Python SDK is not installed: python3 -m pip install ./sdk/python" >&2; exit 1; }

WORK=$(mktemp -d /var/tmp/cairn-bench-sdk.XXXXXX)
export CAIRN_HOME=$WORK/home
cleanup() {
  [[ -f $WORK/created ]] && while read -r id; do "$CAIRN" destroy "$id" >/dev/null 2>&1 || true; done <"$WORK/created"
  [[ -n ${WARM:-} ]] && "$CAIRN" destroy "$WARM" >/dev/null 2>&1 || true
  [[ -n ${DAEMON:-} ]] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

busybox_rootfs "$WORK/rootfs"

start_daemon --disk-pool 4
"$CAIRN" image import bench "$WORK/rootfs" >/dev/null
WARM=$("$CAIRN" task create --image bench)
destroy_created_script
PY="python3 $ROOT/bench/sdk_bench.py"

hyperfine --style basic --warmup 3 --runs "$RUNS" --export-json "$WORK/results.json" \
  --prepare "$WORK/destroy-created.sh" \
  -n "cli: exec (warm)" "$CAIRN exec $WARM -- /bin/true" \
  -n "sdk: exec (warm), new process" "$PY exec $WARM" \
  -n "cli: create + first exec" "id=\$($CAIRN task create --image bench) && echo \$id >>$WORK/created && $CAIRN exec \$id -- /bin/true" \
  -n "sdk: create + first exec, new process" "$PY create bench $WORK/created" \
  -n "python3 -c 'import cairn'" "python3 -c 'import cairn'"
$PY inproc "$WARM" bench 200 >"$WORK/inproc.json"

python3 - "$WORK/results.json" "$WORK/inproc.json" "$RUNS" "$ROOT/docs/benchmarks.md" <<'PY'
import json, statistics, sys, datetime, os
res = {r["command"]: r for r in json.load(open(sys.argv[1]))["results"]}
inproc = json.load(open(sys.argv[2]))
runs, doc = sys.argv[3], sys.argv[4]
med = lambda name: statistics.median(res[name]["times"]) * 1e3
cli_exec, cli_create = med("cli: exec (warm)"), med("cli: create + first exec")
rows = [
    ("cli: exec (warm), a new process per call", cli_exec, cli_exec),
    ("sdk: exec (warm), a new process per call", med("sdk: exec (warm), new process"), cli_exec),
    ("sdk: exec (warm), in one process (`Client`)", inproc["exec"], cli_exec),
    ("sdk: exec (warm), in one process (`AsyncClient`)", inproc["exec_async"], cli_exec),
    ("cli: create + first exec, new processes", cli_create, cli_create),
    ("sdk: create + first exec, a new process", med("sdk: create + first exec, new process"), cli_create),
    ("sdk: create + first exec, in one process", inproc["create_exec"], cli_create),
    ("python3 -c 'import cairn' alone", med("python3 -c 'import cairn'"), None),
]
out = ["## Python SDK", "",
       f"The SDK (`sdk/python`) next to the CLI, on a warm task and on create + first exec of `/bin/true` in the",
       f"busybox image; `bench/sdk.sh` reproduces it. Process-per-call lines: one `hyperfine` run, {runs} runs each",
       f"after 3 warm-ups. In-process lines: one Python process, median of {inproc['n']} execs and {inproc['creates']} creates,",
       "after 10 warm-up execs, with the client's connection kept open.", "",
       f"- date: {datetime.date.today()}", "",
       "| what | median | vs the CLI |", "|---|---:|---:|"]
for name, m, base in rows:
    out.append(f"| {name} | {m:.2f} ms | {'' if base is None else f'{m / base:.2f}×'} |")
out += ["",
        "A new Python process per call pays the interpreter and the imports (httpx, cryptography) each time,",
        "as the last line shows; an agent keeps one client, and then an exec is a plain HTTP request on an open",
        "connection: no process start, no WebSocket handshake.", ""]
text = open(doc).read()
start = text.find("\n## Python SDK\n")
section = "\n".join(out)
if start >= 0:
    nxt = text.find("\n## ", start + 1)
    text = text[:start + 1] + section + (text[nxt:] if nxt >= 0 else "\n")
else:
    text = text.rstrip("\n") + "\n\n" + section
open(doc, "w").write(text)
print(section)
PY
