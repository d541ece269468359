#!/usr/bin/env bash
# Event intake on PostgreSQL next to SQLite: signed webhooks a second that
# one daemon takes in, with its task database in SQLite (the default) and in
# PostgreSQL (`--store postgres://...`), in one run, each round alternating
# the two. A task is suspended on a wait nobody answers; HOOKS webhooks to
# another name (each accepted, logged and kept in the task's inbox) are
# posted by 8 threads over keep-alive connections, then HOOKS by one.
#
#   bench/intake.sh               # prints the markdown section
#   bench/intake.sh --write-docs  # ... and puts it into docs/benchmarks.md
#   HOOKS=2000 ROUNDS=3           # webhooks per run, rounds per store
#
# PostgreSQL is Debian's package, run privately in the work directory with
# its durable defaults (fsync on, synchronous_commit on), as SQLite runs
# with synchronous=FULL. Needs root, postgresql, python3 with
# standardwebhooks, and a release build of cairn (built when missing).
set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HOOKS=${HOOKS:-2000}
ROUNDS=${ROUNDS:-3}
DOC=
for a in "$@"; do
  case $a in
    --write-docs) DOC=$ROOT/docs/benchmarks.md ;;
    *) echo "usage: $0 [--write-docs]" >&2; exit 2 ;;
  esac
done

PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [[ -z $PGBIN ]]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
python3 -c 'import standardwebhooks' 2>/dev/null || python3 -m pip install -q standardwebhooks
(cd "$ROOT" && cargo build --release --locked -q -p cairn-cli)  # a no-op when the build is current

WORK=$(mktemp -d /var/tmp/cairn-intake.XXXXXX)
chmod 755 "$WORK"
cp "$ROOT/target/release/cairn" "$WORK/cairn"
CAIRN=$WORK/cairn
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
DAEMON= PG= TASK=
stop_daemon() {
  [[ -n $TASK ]] && "$CAIRN" destroy "$TASK" >/dev/null 2>&1 || true
  TASK=
  [[ -n $DAEMON ]] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
  DAEMON=
}
cleanup() {
  stop_daemon
  [[ -n $PG ]] && kill "$PG" 2>/dev/null && wait "$PG" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A private PostgreSQL on a free loopback port, owned by the postgres user
# (initdb refuses root).
PGPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$WORK/pg"
chown postgres: "$WORK/pg"
runuser -u postgres -- "$PGBIN/initdb" -D "$WORK/pg/data" -U postgres --auth=trust --encoding=UTF8 --locale=C >/dev/null
runuser -u postgres -- "$PGBIN/postgres" -D "$WORK/pg/data" -p "$PGPORT" -k "$WORK/pg" -c listen_addresses=127.0.0.1 \
  >"$WORK/pg/log" 2>&1 &
PG=$!
for _ in $(seq 100); do "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PGPORT" && break; sleep 0.1; done
"$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PGPORT" || { cat "$WORK/pg/log" >&2; exit 1; }

# start_daemon HOME [ARGS...]
start_daemon() {
  export CAIRN_HOME=$1
  shift
  setsid "$CAIRN" serve --listen 127.0.0.1:0 "$@" >>"$WORK/daemon.log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 100); do [[ -s $CAIRN_HOME/url ]] && "$CAIRN" task list >/dev/null 2>&1 && break; sleep 0.1; done
}

post_hooks() { # store round
  local url secret
  TASK=$("$CAIRN" task create --disk 256M)
  "$CAIRN" --json wait "$TASK" --webhook never-sent >/dev/null
  secret=$("$CAIRN" --json task show "$TASK" | python3 -c 'import json, sys; print(json.load(sys.stdin)["webhook_secret"])')
  url="$(cat "$CAIRN_HOME/url")/v1/hooks/$TASK/other"
  python3 - "$url" "$secret" "$HOOKS" "$1" "$2" >>"$RESULTS" <<'PY'
import datetime, http.client, json, queue, sys, threading, time, urllib.parse
from standardwebhooks import Webhook
url, secret, n, store, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
u = urllib.parse.urlsplit(url)
wh = Webhook(secret)
for threads in (8, 1):
    now = datetime.datetime.now(tz=datetime.timezone.utc)
    jobs = queue.Queue()
    for i in range(n):
        body = json.dumps({"n": i}).encode()
        mid = f"msg_{store}_{rnd}_{threads}_{i:06d}"
        jobs.put((body, {"webhook-id": mid, "webhook-timestamp": str(int(now.timestamp())),
                         "webhook-signature": wh.sign(mid, now, body.decode()), "content-type": "application/json"}))
    bad = []
    def worker():
        c = http.client.HTTPConnection(u.hostname, u.port)
        while True:
            try:
                body, headers = jobs.get_nowait()
            except queue.Empty:
                break
            c.request("POST", u.path, body=body, headers=headers)
            r = c.getresponse()
            answer = r.read()
            if r.status != 200 or json.loads(answer).get("duplicate") is not False:
                bad.append(r.status)
        c.close()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    if bad:
        sys.exit(f"{store}: {len(bad)} webhooks not accepted: {bad[:5]}")
    print(json.dumps({"store": store, "round": int(rnd), "threads": threads, "n": n, "per_s": n / wall}))
PY
  # Every accepted webhook is in the task's log exactly once.
  local logged
  logged=$("$CAIRN" --json log "$TASK" | python3 -c 'import json, sys; print(sum(1 for e in json.load(sys.stdin) if e["kind"] == "event_received" and e["args"].get("name") == "other"))')
  [[ $logged == $((2 * HOOKS)) ]] || { echo "$1: $logged events logged, not $((2 * HOOKS))" >&2; exit 1; }
}

for r in $(seq "$ROUNDS"); do
  echo "round $r of $ROUNDS: SQLite" >&2
  start_daemon "$WORK/home-sqlite-$r"
  post_hooks sqlite "$r"
  stop_daemon
  echo "round $r of $ROUNDS: PostgreSQL" >&2
  runuser -u postgres -- "$PGBIN/psql" -q -h 127.0.0.1 -p "$PGPORT" -U postgres -c "CREATE DATABASE cairn_$r" >/dev/null
  start_daemon "$WORK/home-pg-$r" --store "postgres://postgres@127.0.0.1:$PGPORT/cairn_$r"
  post_hooks postgres "$r"
  stop_daemon
done

PGVER=$("$PGBIN/postgres" --version)
python3 - "$RESULTS" "$HOOKS" "$ROUNDS" "$PGVER" "${DOC:-}" "$ROOT" <<'PY'
import datetime, json, os, platform, statistics, subprocess, sys
sys.path.insert(0, os.path.join(sys.argv[6], "bench"))
from machine import cpu_model, mem_total
res = [json.loads(l) for l in open(sys.argv[1])]
hooks, rounds, pgver, doc, root = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
def rates(store, threads):
    return [r["per_s"] for r in res if r["store"] == store and r["threads"] == threads]
commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
out = ["## Event intake on PostgreSQL", "",
       "Signed webhooks a second that one daemon takes in (`bench/intake.sh`): each is verified,",
       "checked for a duplicate id, written with its event to the task's log and inbox in one",
       "transaction, and answered. The task database in SQLite (`synchronous=FULL`, the default) and in",
       f"PostgreSQL (`--store postgres://...`, a private PostgreSQL {pgver.split(' ')[2]} server on loopback with its durable",
       f"defaults), {rounds} rounds alternating the two, {hooks} webhooks per run, by 8 client threads over",
       "keep-alive connections and then by one. Every webhook was accepted and logged once.", "",
       f"- date: {datetime.date.today()}",
       f"- machine: {os.cpu_count()} cores, {cpu_model()}, {mem_total()}, kernel {platform.release()}",
       f"- commit: {commit}; {pgver}; load average at the end: {os.getloadavg()[0]:.2f}", "",
       "| store | clients | webhooks/s, median | each round | vs SQLite |", "|---|---:|---:|---|---:|"]
for threads in (8, 1):
    base = statistics.median(rates("sqlite", threads))
    for store, name in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
        xs = rates(store, threads)
        m = statistics.median(xs)
        out.append(f"| {name} | {threads} | {m:,.0f} | {', '.join(f'{x:,.0f}' for x in xs)} | {m / base:.2f}× |")
out += ["", "Each webhook costs one commit: SQLite's is an fsync of its write-ahead log by the one writer;",
        "PostgreSQL's a round trip to the server and a flush of its WAL, which concurrent commits share",
        "(group commit), while the row lock on the task keeps one task's writers in turn.", ""]
section = "\n".join(out)
print(section)
if doc:
    text = open(doc).read()
    start = text.find("\n## Event intake on PostgreSQL\n")
    if start >= 0:
        nxt = text.find("\n## ", start + 1)
        text = text[:start + 1] + section + (text[nxt:] if nxt >= 0 else "\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(doc, "w").write(text)
PY
