#!/usr/bin/env bash
# E2B's Python SDK against Cairn next to Cairn's own SDK, in one run on one
# daemon: create + first command, a warm command round trip, a 10 MB file
# written and read back. Each SDK in one long-lived Python process (as an
# agent uses it). Writes the "## E2B's SDK against Cairn" section of
# docs/benchmarks.md.
#
#   bench/e2b.sh            # 200 round trips, 20 creates and 20 transfers (N=... to change)
#
# Needs root, the e2b SDK's environment (/opt/cairn-test/e2b, made by
# scripts/setup-debian.sh), Cairn's SDK (pip install ./sdk/python) and a
# release build of cairn (built when missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
N=${N:-200}
CAIRN=$ROOT/target/release/cairn
E2B_PY=${CAIRN_E2B_PYTHON:-/opt/cairn-test/e2b/bin/python}
[[ -x $CAIRN ]] || (cd "$ROOT" && cargo build --release --locked -p cairn-cli)
"$E2B_PY" -c 'import e2b' || { echo "no e2b SDK at $E2B_PY: run scripts/setup-debian.sh" >&2; exit 1; }
python3 -c 'import cairn' || { echo "the Python SDK is not installed: python3 -m pip install ./sdk/python" >&2; exit 1; }

WORK=$(mktemp -d /var/tmp/cairn-bench-e2b.XXXXXX)
export CAIRN_HOME=$WORK/home
cleanup() {
  [[ -n ${DAEMON:-} ]] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
start_daemon --disk-pool 4
URL=$(cat "$CAIRN_HOME/url")
KEY=$("$CAIRN" api-key create bench)
E2B_API_URL=$URL E2B_SANDBOX_URL=$URL E2B_API_KEY=$KEY "$E2B_PY" "$ROOT/bench/e2b_bench.py" e2b "$N" >"$WORK/e2b.json"
CAIRN_URL=$URL CAIRN_TOKEN=$(cat "$CAIRN_HOME/token") python3 "$ROOT/bench/e2b_bench.py" cairn "$N" >"$WORK/cairn.json"
CAIRN_URL=$URL CAIRN_TOKEN=$(cat "$CAIRN_HOME/token") python3 "$ROOT/bench/e2b_bench.py" port "$((N * 5))" >"$WORK/port.json"
CAIRN_URL=$URL CAIRN_TOKEN=$(cat "$CAIRN_HOME/token") ISOLATION=gvisor python3 "$ROOT/bench/e2b_bench.py" port "$N" >"$WORK/port-gvisor.json"

python3 - "$WORK/e2b.json" "$WORK/cairn.json" "$ROOT/docs/benchmarks.md" "$("$E2B_PY" -m pip show e2b | awk '/^Version/ {print $2}')" <<'PY'
import json, sys, datetime, os
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[3]), "..", "bench"))
from section import write_section
e2b, cairn, doc, version = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
port = json.load(open(os.path.join(os.path.dirname(sys.argv[1]), "port.json")))
gport = json.load(open(os.path.join(os.path.dirname(sys.argv[1]), "port-gvisor.json")))
rows = [("create + first command", "create_first"), ("warm command round trip", "run"),
        ("10 MB file write", "write_10mb"), ("10 MB file read", "read_10mb")]
out = ["## E2B's SDK against Cairn", "",
       f"E2B's Python SDK (`e2b` {version} from PyPI, unmodified, configured by `E2B_API_URL`, `E2B_SANDBOX_URL`",
       "and `E2B_API_KEY` only) and Cairn's own SDK against one daemon, one after the other in one run, each in",
       f"one long-lived process: median of {e2b['n']} command round trips (`bash -l -c true`, what E2B's",
       f"`commands.run` runs, for both), {max(3, e2b['n'] // 10)} creates + first command and {max(3, e2b['n'] // 10)} writes and reads of 10 MB,",
       "on the node's default image. `bench/e2b.sh` reproduces it.", "",
       f"- date: {datetime.date.today()}", "",
       "| what | E2B SDK | Cairn SDK | E2B / Cairn |", "|---|---:|---:|---:|"]
for name, key in rows:
    out.append(f"| {name} | {e2b[key]:.2f} ms | {cairn[key]:.2f} ms | {e2b[key] / cairn[key]:.2f}× |")
out += ["",
        f"A port (an HTTP GET of a small page from `python3 -m http.server` in a task; medians of {port['n']} native",
        f"and {gport['n']} gvisor):",
        "", "| what | native | added | gvisor | added |", "|---|---:|---:|---:|---:|",
        f"| inside the task (`urllib`, a new connection each) | {port['inside']:.3f} ms | | {gport['inside']:.3f} ms | |",
        f"| through the daemon (`/v1/tasks/ID/ports/8000/`, a kept-alive client) | {port['through_daemon']:.3f} ms | {port['through_daemon'] - port['inside']:+.3f} ms | {gport['through_daemon']:.3f} ms | {gport['through_daemon'] - gport['inside']:+.3f} ms |",
        "",
        "E2B's command is a Connect server stream (an HTTP/1.1 request, enveloped JSON messages back), Cairn's",
        "a plain request; both run the command through the same engine. E2B's write is a multipart upload that",
        "a `cat` in the sandbox writes as the call's user; Cairn's a raw body the daemon writes through its",
        "descriptor-relative file code. Through the daemon, a port's request is relayed over a connection the",
        "sandbox's init makes on its own loopback, one per request; under gvisor over a relay that `runsc exec`",
        "starts inside the sandbox, one per request too (gVisor's network stack is not the host's): the goal",
        f"is under 1 ms added; a gvisor port pays a `runsc exec` per request (~{gport['through_daemon'] - gport['inside']:.0f} ms), which a relay kept",
        "per client connection would remove (not done yet).", ""]
section = "\n".join(out)
write_section(doc, section)
print(section)
PY
