#!/usr/bin/env bash
# Suspend and wake benchmark: how long a task takes to come back after the
# event it waits for (workspaces of 10 MB and 200 MB, woken by an event, an
# approval and `cairn resume`, and from the blob store without the local
# disk cache), how long a suspend takes, what 1,000 suspended tasks cost the
# host (daemon memory, processes, mounts, loop devices, disk) and how many
# signed webhooks a second the gateway takes in.
#
#   bench/wake.sh                  # prints the markdown section
#   bench/wake.sh --write-docs     # ... and puts it into docs/benchmarks.md
#   WAKES=30                       # wake cycles per size and trigger
#   SLOW=5                         # wakes without the local disk cache, per size
#   SUSPENDED=1000                 # tasks suspended at once
#   PAR=2                          # parallel create+suspend (and 4x for destroy)
#   HOOKS=2000                     # webhooks posted, by 8 client threads
#   DAEMON_LOG=FILE                # keep the daemon log (RUST_LOG applies)
#   RAW=FILE                       # keep every measurement (JSON lines; FILE.meta.json too)
#
# One daemon for everything, in a new home. Each wake cycle: append 4 KB to
# a file (a step of work), `cairn wait --webhook go` (the task is
# snapshotted and its sandbox destroyed before it returns), `cairn event
# --name go`, `cairn exec ID -- true` (which waits for the wake). The wake's
# own timing (event accepted to sandbox ready) comes from the `wake` event in
# the task's log. Needs root, python3 with `standardwebhooks` (installed when
# missing) and a release build of cairn (built when missing).
set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WAKES=${WAKES:-30}
SLOW=${SLOW:-5}
SUSPENDED=${SUSPENDED:-1000}
PAR=${PAR:-2}
HOOKS=${HOOKS:-2000}
WRITE_DOCS=()
for a in "$@"; do
  case $a in
    --write-docs) WRITE_DOCS=(--write-docs "$ROOT/docs/benchmarks.md") ;;
    *) echo "usage: $0 [--write-docs]" >&2; exit 2 ;;
  esac
done

need=()
for p in python3:python3 losetup:util-linux mkfs.ext4:e2fsprogs; do
  command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if ((${#need[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -c 'import standardwebhooks' 2>/dev/null || python3 -m pip install -q standardwebhooks
(cd "$ROOT" && cargo build --release --locked -q -p cairn-cli)  # a no-op when the build is current

WORK=$(mktemp -d /var/tmp/cairn-wakebench.XXXXXX)
# A copy, so that a rebuild during the run does not mix two versions.
cp "$ROOT/target/release/cairn" "$WORK/cairn"
CAIRN=$WORK/cairn
export CAIRN_HOME=$WORK/home
RESULTS=$WORK/results.jsonl # {"g": group, "k": key, "v": value}
: >"$RESULTS"
: >"$WORK/created"
DAEMON=
cleanup() {
  if [[ -s $WORK/created ]]; then
    xargs -P 8 -I{} "$CAIRN" destroy {} <"$WORK/created" >/dev/null 2>&1 || true
  fi
  if [[ -n $DAEMON ]]; then stop_daemon; fi
  if [[ -n ${DAEMON_LOG:-} && -f $WORK/daemon.log ]]; then cp "$WORK/daemon.log" "$DAEMON_LOG"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stamp() { printf -v "$1" '%s' "${EPOCHREALTIME/./}"; } # microseconds, no fork
rec() { printf '{"g": "%s", "k": "%s", "v": %s}\n' "$1" "$2" "$3" >>"$RESULTS"; }
jget() { python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v[k]
print(v)' "$1"; }
created() { echo "$1" >>"$WORK/created"; }
forget() { grep -vx "$1" "$WORK/created" >"$WORK/created.new" || true; mv "$WORK/created.new" "$WORK/created"; }
rss_kb() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$DAEMON/status"; }
state_of() { "$CAIRN" --json task show "$1" | jget state; }

# The wake and suspend events of a task's log after sequence number $2, as
# result lines of group $3; prints the last sequence number.
cat >"$WORK/extract.py" <<'PY'
import json, sys
log, since, group, out = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3], sys.argv[4]
last = since
with open(out, "a") as f:
    for e in log:
        last = max(last, e["seq"])
        if e["seq"] <= since:
            continue
        if e["kind"] == "wake":
            f.write(json.dumps({"g": group, "k": "wake", "v": dict(e["args"], exit_code=e["exit_code"])}) + "\n")
        elif e["kind"] == "snapshot" and e["args"].get("kind") == "suspend":
            f.write(json.dumps({"g": group, "k": "snapshot", "v": {"duration_ms": e["duration_ms"], "freeze_ms": e["args"].get("freeze_ms")}}) + "\n")
        elif e["kind"] == "suspend" and e["args"].get("phase") == "end":
            f.write(json.dumps({"g": group, "k": "suspend", "v": dict(e["args"], duration_ms=e["duration_ms"], exit_code=e["exit_code"])}) + "\n")
print(last)
PY
declare -A SEQ # task -> last log sequence number collected
collect() { # task, group
  "$CAIRN" --json log "$1" >"$WORK/log.json"
  SEQ[$1]=$(python3 "$WORK/extract.py" "$WORK/log.json" "${SEQ[$1]:-0}" "$2" "$RESULTS")
}

python3 - "$WORK/meta.json" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$WAKES" "$SLOW" "$SUSPENDED" "$PAR" "$HOOKS" <<'PY'
import json, os, sys
keys = ("wakes", "slow", "suspended", "par", "hooks")
meta = dict(zip(keys, map(int, sys.argv[3:])), commit=sys.argv[2], load_before=os.getloadavg()[0])
json.dump(meta, open(sys.argv[1], "w"))
PY
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
  echo "note: load average $load at the start; other work will show in the numbers" >&2
fi

LOG=${RUST_LOG:-cairn_server=debug,cairn_sandbox=debug}
start_daemon() {
  rm -f "$CAIRN_HOME/url"
  # setsid: Ctrl-C must reach this script, not the daemon, so cleanup can
  # still destroy the tasks through it.
  RUST_LOG="$LOG" setsid "$CAIRN" serve --listen 127.0.0.1:0 --disk-pool 4 >>"$WORK/daemon.log" 2>&1 &
  DAEMON=$!
  echo "$DAEMON" >"$WORK/daemon.pid"
  # Ready when it takes a connection (an API call would allocate in it, and
  # its memory is measured right after).
  for _ in $(seq 100); do
    if [[ -s $CAIRN_HOME/url ]]; then
      URL=$(cat "$CAIRN_HOME/url")
      (exec 3<>"/dev/tcp/127.0.0.1/${URL##*:}") 2>/dev/null && break
    fi
    sleep 0.1
  done
}
stop_daemon() {
  kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
  DAEMON=
}
start_daemon

# ---- wake latency and suspend time, per workspace size --------------------
wake_after() { # task, group, t0: the exec that waits for the wake, then the client's view
  local t1
  "$CAIRN" exec "$1" -- true
  stamp t1
  rec "$2" e2e_us $((t1 - $3))
}
work_step() { "$CAIRN" exec "$1" -- sh -c 'head -c 4096 /dev/urandom >>/workspace/notes'; }
check_suspended() { # task, wait answer
  local s
  s=$(jget task_state <<<"$2")
  if [[ $s != suspended ]]; then echo "task $1 is $s after its wait, not suspended" >&2; exit 1; fi
}

declare -A TASK HASH
for MB in 10 200; do
  T=$("$CAIRN" task create --disk 1G)
  created "$T"
  TASK[$MB]=$T
  rec "$MB" task "\"$T\""
  # Ten files of random data (incompressible, nothing to deduplicate).
  "$CAIRN" exec "$T" -- sh -c "for i in 0 1 2 3 4 5 6 7 8 9; do head -c $((MB * 1024 * 1024 / 10)) /dev/urandom >/workspace/data\$i; done"
  HASH[$MB]=$("$CAIRN" exec "$T" -- sh -c 'cat /workspace/data* | sha256sum')
done

# By event: the two sizes alternate, so that both see the same background.
echo "$WAKES wakes by event per size" >&2
for _ in $(seq "$WAKES"); do
  for MB in 10 200; do
    T=${TASK[$MB]}
    work_step "$T"
    stamp a
    out=$("$CAIRN" --json wait "$T" --webhook go)
    stamp b
    check_suspended "$T" "$out"
    rec "${MB}/event" wait_us $((b - a))
    stamp a
    "$CAIRN" --json event "$T" --name go --data '{}' >/dev/null
    stamp b
    rec "${MB}/event" event_us $((b - a))
    wake_after "$T" "${MB}/event" "$a"
  done
done
for MB in 10 200; do collect "${TASK[$MB]}" "${MB}/event"; done

# By approval and by `cairn resume`, 10 MB only.
T=${TASK[10]}
echo "$WAKES wakes by approval, $WAKES by cairn resume" >&2
for _ in $(seq "$WAKES"); do
  work_step "$T"
  out=$("$CAIRN" --json wait "$T" --approval "continue?")
  check_suspended "$T" "$out"
  stamp a
  "$CAIRN" approve "$T" >/dev/null
  wake_after "$T" 10/approval "$a"
done
collect "$T" 10/approval
for _ in $(seq "$WAKES"); do
  work_step "$T"
  stamp a
  "$CAIRN" --json suspend "$T" >/dev/null
  stamp b
  rec 10/resume suspend_us $((b - a))
  stamp a
  "$CAIRN" --json resume "$T" >/dev/null
  stamp b
  rec 10/resume resume_us $((b - a))
  wake_after "$T" 10/resume "$a"
done
collect "$T" 10/resume

# Without the local cache: the disk image of the suspended task removed (as
# on a node that did not suspend it), so the wake restores the workspace
# from the blob store onto a new disk.
if ((SLOW > 0)); then
  echo "$SLOW wakes from the blob store per size" >&2
  for _ in $(seq "$SLOW"); do
    for MB in 10 200; do
      T=${TASK[$MB]}
      work_step "$T"
      out=$("$CAIRN" --json wait "$T" --webhook go)
      check_suspended "$T" "$out"
      img=$CAIRN_HOME/disks/$T.img
      if [[ ! -f $img ]]; then echo "no cached disk image for $T where expected" >&2; exit 1; fi
      rm -f "$img"
      sync
      stamp a
      "$CAIRN" --json event "$T" --name go --data '{}' >/dev/null
      wake_after "$T" "${MB}/blob" "$a"
    done
  done
  for MB in 10 200; do collect "${TASK[$MB]}" "${MB}/blob"; done
fi

for MB in 10 200; do
  T=${TASK[$MB]}
  if [[ ${HASH[$MB]} != "$("$CAIRN" exec "$T" -- sh -c 'cat /workspace/data* | sha256sum')" ]]; then
    echo "${MB} MB: the workspace changed across the wakes" >&2
    exit 1
  fi
  rec "${MB}/event" files_verified 1
  "$CAIRN" destroy "$T" >/dev/null
  forget "$T"
done

# ---- webhook intake --------------------------------------------------------
# One task suspended on a wait nobody answers; HOOKS webhooks to another
# name (accepted and kept in its inbox, none wakes it), each signed in
# advance with a unique webhook-id, posted by 8 threads over keep-alive
# connections, then HOOKS more by a single one.
T=$("$CAIRN" task create --disk 256M)
created "$T"
out=$("$CAIRN" --json wait "$T" --webhook never-sent)
check_suspended "$T" "$out"
SECRET=$("$CAIRN" --json task show "$T" | jget webhook_secret)
echo "posting $HOOKS webhooks from 8 threads, then $HOOKS from one" >&2
python3 - "$URL/v1/hooks/$T/other" "$SECRET" "$HOOKS" >>"$RESULTS" <<'PY'
import collections, datetime, http.client, json, queue, sys, threading, time, urllib.parse
from standardwebhooks import Webhook
url, secret, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
u = urllib.parse.urlsplit(url)
wh = Webhook(secret)

def run(threads):
    now = datetime.datetime.now(tz=datetime.timezone.utc)
    jobs = queue.Queue()
    for i in range(n):
        body = json.dumps({"n": i, "note": "benchmark"})
        mid = f"msg_bench_{threads}_{i:06d}"
        jobs.put((body.encode(), {"webhook-id": mid, "webhook-timestamp": str(int(now.timestamp())),
                                  "webhook-signature": wh.sign(mid, now, body), "content-type": "application/json"}))
    ok, refused, statuses, errors = [], [], collections.Counter(), collections.Counter()
    lock = threading.Lock()
    def worker():
        c = http.client.HTTPConnection(u.hostname, u.port)
        mine_ok, mine_bad = [], []
        while True:
            try:
                body, headers = jobs.get_nowait()
            except queue.Empty:
                break
            t0 = time.perf_counter()
            c.request("POST", u.path, body=body, headers=headers)
            r = c.getresponse()
            answer = r.read()
            ms = (time.perf_counter() - t0) * 1000
            try:
                a = json.loads(answer)
            except ValueError:
                a = {}
            good = r.status == 200 and a.get("duplicate") is False
            (mine_ok if good else mine_bad).append(ms)
            with lock:
                statuses[r.status] += 1
                if not good:
                    why = a.get("error", "duplicate" if a.get("duplicate") else str(answer[:80]))
                    errors[f"{r.status}: {why}"] += 1
        c.close()
        with lock:
            ok.extend(mine_ok)
            refused.extend(mine_bad)
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    print(json.dumps({"g": "hooks", "k": "run", "v": {"n": n, "threads": threads, "wall_s": wall, "ok_ms": ok,
                      "refused_ms": refused, "statuses": statuses, "errors": errors}}))

for threads in (8, 1):
    run(threads)
PY
sleep 1
"$CAIRN" --json log "$T" >"$WORK/log.json"
python3 - "$WORK/log.json" "$(state_of "$T")" >>"$RESULTS" <<'PY'
import json, sys
log = json.load(open(sys.argv[1]))
got = sum(1 for e in log if e["kind"] == "event_received" and e["args"].get("name") == "other")
print(json.dumps({"g": "hooks", "k": "logged", "v": {"events": got, "state_after": sys.argv[2]}}))
PY
"$CAIRN" destroy "$T" >/dev/null
forget "$T"

# ---- 1,000 suspended tasks -------------------------------------------------
# What the host keeps for suspended tasks: daemon memory (VmRSS), their
# processes (any process whose cgroup names one of them), cgroups, mounts,
# loop devices, and the disk images kept as a local cache.
cat >"$WORK/footprint.py" <<'PY'
import glob, json, os, sys
ids = set(open(sys.argv[1]).read().split())
def mentions(text):
    return any(i in text for i in ids)
procs = 0
for p in glob.glob("/proc/[0-9]*/cgroup"):
    try:
        if mentions(open(p).read()):
            procs += 1
    except OSError:
        pass
cgroups = 0
for root, dirs, _ in os.walk("/sys/fs/cgroup"):
    for d in dirs:
        if d in ids or mentions(d):
            cgroups += 1
mounts = sum(1 for line in open("/proc/self/mountinfo") if mentions(line))
loops = 0
for f in glob.glob("/sys/block/loop*/loop/backing_file"):
    try:
        if mentions(open(f).read()):
            loops += 1
    except OSError:
        pass
run = os.path.join(os.environ["CAIRN_HOME"], "run")
run_dirs = sum(1 for d in os.listdir(run) if d in ids) if os.path.isdir(run) else 0
print(json.dumps({"procs": procs, "cgroups": cgroups, "mounts": mounts, "loops": loops, "run_dirs": run_dirs,
                  "host_procs": len(glob.glob("/proc/[0-9]*"))}))
PY
# The states of the tasks listed in $2, from `task list --json` in $1, as
# result line $3 $4.
cat >"$WORK/states.py" <<'PY'
import json, sys
ids = set(open(sys.argv[2]).read().split())
tasks = json.load(open(sys.argv[1]))
tasks = tasks.get("tasks", tasks) if isinstance(tasks, dict) else tasks
states = {}
for t in tasks:
    if t["id"] in ids:
        states[t["state"]] = states.get(t["state"], 0) + 1
print(json.dumps({"g": sys.argv[3], "k": sys.argv[4], "v": states}))
PY
cat >"$WORK/one.sh" <<SH
#!/usr/bin/env bash
# Creates a task with a small workspace (ten 4 KB files) and suspends it;
# prints the create and suspend times and the daemon's VmRSS afterwards.
set -euo pipefail
a=\${EPOCHREALTIME/./}
id=\$("$CAIRN" task create --disk 256M)
echo "\$id" >>"$WORK/created"
echo "\$id" >>"$WORK/many"
b=\${EPOCHREALTIME/./}
"$CAIRN" exec "\$id" -- sh -c 'for i in 0 1 2 3 4 5 6 7 8 9; do head -c 4096 /dev/urandom >/workspace/f\$i; done'
c=\${EPOCHREALTIME/./}
"$CAIRN" --json suspend "\$id" >/dev/null
d=\${EPOCHREALTIME/./}
echo "\$((b - a)) \$((d - c)) \$(awk '\$1 == "VmRSS:" { print \$2 }' "/proc/\$(cat "$WORK/daemon.pid")/status")" >>"$WORK/many.times"
SH
chmod +x "$WORK/one.sh"

G=many
: >"$WORK/many"
HALF=$((SUSPENDED / 2))
restart() { # key: a new daemon process on the same home, its RSS 3 s after start
  stop_daemon
  start_daemon
  sleep 3
  rec $G "rss_$1_kb" "$(rss_kb VmRSS)"
  rec $G "anon_$1_kb" "$(rss_kb RssAnon)"
}
create_suspend() { # count
  : >"$WORK/many.times"
  stamp a
  seq "$1" | xargs -P "$PAR" -I{} "$WORK/one.sh" || echo "some creates or suspends failed (see the states below)" >&2
  stamp b
  rec $G create_suspend_us $((b - a))
  while read -r c s r; do rec $G create_us "$c"; rec $G suspend_us "$s"; rec $G rss_kb "$r"; done <"$WORK/many.times"
}
footprint() { # suffix
  "$CAIRN" --json task list >"$WORK/list.json"
  python3 "$WORK/states.py" "$WORK/list.json" "$WORK/many" "$G" "states$1" >>"$RESULTS"
  rec $G "footprint$1" "$(python3 "$WORK/footprint.py" "$WORK/many")"
}
# Daemon memory for them, measured on new daemon processes on the same home
# (with none, half and all of them suspended), so that nothing else differs:
# not what the runs above left in its heap, nor what creating them did.
echo "creating and suspending $SUSPENDED tasks ($PAR at a time), restarting the daemon at 0, $HALF and $SUSPENDED" >&2
restart none
create_suspend "$HALF"
restart half
# The running daemon's growth over the second half: what creating and
# suspending them leaves in its heap.
sleep 2
rec $G rss_before_kb "$(rss_kb VmRSS)"
rec $G anon_before_kb "$(rss_kb RssAnon)"
create_suspend $((SUSPENDED - HALF))
sleep 2
rec $G rss_after_kb "$(rss_kb VmRSS)"
rec $G anon_after_kb "$(rss_kb RssAnon)"
rec $G grown_over "$((SUSPENDED - HALF))"
rec $G count "$(wc -l <"$WORK/many")"
rec $G daemon_threads "$(awk '$1 == "Threads:" { print $2 }' "/proc/$DAEMON/status")"
rec $G daemon_fds "$(find "/proc/$DAEMON/fd" -mindepth 1 -maxdepth 1 | wc -l)"
footprint ""
# Their own disk images only (the pool's ready disks are in the same directory).
sed "s|.*|$CAIRN_HOME/disks/&.img|" "$WORK/many" >"$WORK/many.imgs"
rec $G disks_after_kb "$(xargs du -ck <"$WORK/many.imgs" | tail -1 | cut -f1)"
rec $G disks_apparent_kb "$(xargs du -ck --apparent-size <"$WORK/many.imgs" | tail -1 | cut -f1)"
rec $G db_kb "$(du -ck "$CAIRN_HOME"/cairn.db* | tail -1 | cut -f1)"
rec $G blobs_kb "$(du -sk "$CAIRN_HOME/blobs" | cut -f1)"
restart all
footprint _restarted

echo "destroying them ($((PAR * 4)) at a time)" >&2
stamp a
xargs -P $((PAR * 4)) -I{} "$CAIRN" destroy {} <"$WORK/many" >/dev/null
stamp b
rec $G destroy_total_us $((b - a))
grep -vxFf "$WORK/many" "$WORK/created" >"$WORK/created.new" || true
mv "$WORK/created.new" "$WORK/created"
rec $G images_left "$(while read -r f; do if [[ -e $f ]]; then echo; fi; done <"$WORK/many.imgs" | wc -l)"

# ---- report ----------------------------------------------------------------
# The sandbox start timings of the wakes, from the daemon's debug log.
python3 - "$WORK/daemon.log" >>"$RESULTS" <<'PY'
import json, re, sys
ansi = re.compile(r"\x1b\[[0-9;]*m")
unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1000.0}
def dur(s):
    m = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", s)
    return float(m.group(1)) * unit[m.group(2)] if m else None
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    line = ansi.sub("", line)
    if "sandbox started" not in line:
        continue
    f = dict(re.findall(r"(\w+)=(\S+)", line))
    v = {k: dur(f[k]) for k in ("disk", "cgroup", "helper") if k in f}
    if len(v) == 3:
        print(json.dumps({"g": "start", "k": "timing", "v": dict(v, task=f.get("task"))}))
PY
if [[ -n ${RAW:-} ]]; then cp "$RESULTS" "$RAW"; cp "$WORK/meta.json" "$RAW.meta.json"; fi
python3 "$ROOT/bench/wake_report.py" "$RESULTS" "$WORK/meta.json" "${WRITE_DOCS[@]}"
