#!/usr/bin/env bash
# The console's pages at scale: 10,000 tasks in the list and a task with
# 100,000 events in its log (paged), served by a release build. Writes the
# "## Console pages" section of docs/benchmarks.md.
#
#   bench/console.sh            # 50 requests a page (N=... to change)
#
# Needs root and a release build of cairn (built when missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
N=${N:-50}
TASKS=${TASKS:-10000}
EVENTS=${EVENTS:-100000}
CAIRN=$ROOT/target/release/cairn
[[ -x $CAIRN ]] || (cd "$ROOT" && cargo build --release --locked -p cairn-cli)

WORK=$(mktemp -d /var/tmp/cairn-bench-console.XXXXXX)
export CAIRN_HOME=$WORK/home
cleanup() {
  [[ -n ${DAEMON:-} ]] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
start_daemon
# The watched task ends before the store is filled: no sandbox is left
# running while the daemon is down, and its log reads the same.
"$CAIRN" task create --name watched >/dev/null
"$CAIRN" exec watched -- true
"$CAIRN" destroy watched >/dev/null
kill "$DAEMON"; wait "$DAEMON" 2>/dev/null || true
echo "filling the store: $TASKS tasks, $EVENTS events"
TASK=$(python3 "$ROOT/bench/console_fill.py" "$CAIRN_HOME/cairn.db" "$TASKS" "$EVENTS")
start_daemon
URL=$(cat "$CAIRN_HOME/url")
python3 "$ROOT/bench/console_bench.py" "$URL" "$(cat "$CAIRN_HOME/token")" "$TASK" "$N" >"$WORK/pages.json"

python3 - "$WORK/pages.json" "$ROOT/docs/benchmarks.md" "$TASKS" "$EVENTS" "$N" <<'PY'
import json, sys, os, datetime
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[2]), "..", "bench"))
from section import write_section
from machine import cpu_model, mem_total
pages = json.load(open(sys.argv[1]))
tasks, events, n = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rows = "\n".join(f"| {name} | `{p['path']}` | {p['median_ms']:.1f} | {p['p95_ms']:.1f} | {p['bytes']:,} |" for name, p in pages.items())
worst = max(p["median_ms"] for p in pages.values())
section = f"""## Console pages

`bench/console.sh`, {datetime.date.today()}, {cpu_model()}, {os.cpu_count()} cores, {mem_total()}. A release daemon
on SQLite with {tasks:,} tasks in its store and one task with {events:,}
events in its log (filled by `bench/console_fill.py`); {n} requests a page
over one keep-alive connection after a logged-in session, timed from the
request to the last byte of the page.

| page | path | median ms | p95 ms | bytes |
|---|---|---|---|---|
{rows}

The goal is under 50 ms a page: the slowest median is {worst:.1f} ms. The
list reads one page of tasks from the store, filtered there by state and
by name or id (`list_tasks_page`); the timeline reads one page of the log
(`events_before`, 200 rows); the ledger's verdict, which walks the whole
chain, is a page of its own that the timeline's script fetches after it.
"""
write_section(sys.argv[2], section)
print(section)
PY
