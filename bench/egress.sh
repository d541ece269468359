#!/usr/bin/env bash
# Egress proxy benchmark: what the proxy every sandbox reaches the network
# through costs against the same transfer without it, on loopback, in one
# run. Throughput of a 1 GiB download (plain HTTP forwarded by the proxy,
# and through a CONNECT tunnel), the latency of small requests on a
# keep-alive connection, and new connections a second.
#
#   bench/egress.sh                # prints the markdown section
#   bench/egress.sh --write-docs   # ... and puts it into docs/benchmarks.md
#   RUNS=7                         # 1 GiB downloads per way
#   DURATION=10                    # seconds of wrk a way, for each of its measurements
#   LAT_ROUNDS=5                   # small-request latency: rounds the DURATION is cut into
#   CONNS=8                        # wrk connections for connections a second
#   REQS=200                       # sequential requests of the curl latency check
#   DAEMON_LOG=FILE                # keep the daemon log (RUST_LOG applies)
#   RAW=FILE                       # keep every measurement (JSON lines; FILE.meta.json too)
#
# The upstream is an nginx of its own (one worker, sendfile, access log off)
# on an ephemeral loopback port, serving a 1 GiB file and a 100-byte one.
# "Direct" clients run on the host against it; proxied ones run inside a
# task's sandbox (`--cpus 2 --memory 2G`, `--allow bench.test`), whose only
# way out is the daemon's proxy on 127.0.0.1:3128, which the daemon's config
# resolves bench.test to nginx's port. A control: the same nginx and files
# inside the sandbox, on its own loopback, for sandbox clients without the
# proxy. Needs root, curl, nginx-light, wrk and python3 (installed when
# missing) and a release build of cairn (built when missing).
set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-7}
DURATION=${DURATION:-10}
LAT_ROUNDS=${LAT_ROUNDS:-5}
CONNS=${CONNS:-8}
REQS=${REQS:-200}
WRITE_DOCS=()
for a in "$@"; do
  case $a in
    --write-docs) WRITE_DOCS=(--write-docs "$ROOT/docs/benchmarks.md") ;;
    *) echo "usage: $0 [--write-docs]" >&2; exit 2 ;;
  esac
done

need=()
for p in python3:python3 curl:curl nginx:nginx-light wrk:wrk fallocate:util-linux; do
  command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if ((${#need[@]})); then
  # RUNLEVEL=1: the package's own nginx service is not started.
  apt-get update -qq && RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
(cd "$ROOT" && cargo build --release --locked -q -p cairn-cli)  # a no-op when the build is current
STALE=0
if [[ -n $(find "$ROOT/crates" "$ROOT/Cargo.lock" -newer "$ROOT/target/release/cairn" \( -name '*.rs' -o -name 'Cargo.*' \) -print -quit) ]]; then
  echo "note: target/release/cairn is older than the sources; rebuild it to measure them" >&2
  STALE=1
fi

WORK=$(mktemp -d /var/tmp/cairn-egressbench.XXXXXX)
# A copy, so that a rebuild during the run does not mix two versions.
cp "$ROOT/target/release/cairn" "$WORK/cairn"
CAIRN=$WORK/cairn
export CAIRN_HOME=$WORK/home
RESULTS=$WORK/results.jsonl # {"g": group, "k": key, "v": value}
: >"$RESULTS"
TASK=
DAEMON=
NGINX=
cleanup() {
  if [[ -n $TASK ]]; then "$CAIRN" destroy "$TASK" >/dev/null 2>&1 || true; fi
  if [[ -n $DAEMON ]]; then kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true; fi
  if [[ -n $NGINX ]]; then kill -QUIT "$NGINX" 2>/dev/null && wait "$NGINX" 2>/dev/null || true; fi
  if [[ -n ${DAEMON_LOG:-} && -f $WORK/daemon.log ]]; then cp "$WORK/daemon.log" "$DAEMON_LOG"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rec() { printf '{"g": "%s", "k": "%s", "v": %s}\n' "$1" "$2" "$3" >>"$RESULTS"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# CPU time (user + system, seconds) of the daemon, its user time alone, the
# CPU time of its SQLite worker threads, of nginx (master and workers), and
# the daemon's threads' voluntary context switches (each a sleep and a
# wake-up), as JSON.
cat >"$WORK/cpu.py" <<'PY'
import glob, json, os, sys
tick = os.sysconf("SC_CLK_TCK")
def cpu(stat, fields=(11, 12)):
    f = open(stat).read().rsplit(")", 1)[1].split()
    return sum(int(f[i]) for i in fields) / tick
daemon, nginx = sys.argv[1], sys.argv[2]
def switches(task):
    return sum(int(l.split()[1]) for l in open(task + "/status") if l.startswith("voluntary_ctxt_switches"))
def threads(f, pick=lambda t: True):
    total = 0
    for t in glob.glob(f"/proc/{daemon}/task/*"):
        try:
            total += f(t) if pick(t) else 0
        except OSError:  # the thread ended meanwhile
            pass
    return total
sqlite = threads(lambda t: cpu(t + "/stat"), lambda t: open(t + "/comm").read().startswith("sqlx-sqlite"))
workers = open(f"/proc/{nginx}/task/{nginx}/children").read().split()
print(json.dumps({"daemon_cpu_s": cpu(f"/proc/{daemon}/stat"), "daemon_user_s": cpu(f"/proc/{daemon}/stat", (11,)),
                  "sqlite_cpu_s": sqlite,
                  "daemon_switches": threads(switches),
                  "nginx_cpu_s": sum(cpu(f"/proc/{p}/stat") for p in [nginx] + workers)}))
PY
cpu_snap() { python3 "$WORK/cpu.py" "$DAEMON" "$NGINX" >"$WORK/cpu.$1"; }
# One result line: group, key, a JSON object, with the CPU used between the
# two snapshots added to it.
cat >"$WORK/with_cpu.py" <<'PY'
import json, sys
g, k, v, a, b = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.load(open(sys.argv[4])), json.load(open(sys.argv[5]))
v.update({key: round(b[key] - a[key], 3) for key in a})
print(json.dumps({"g": g, "k": k, "v": v}))
PY

load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
  echo "note: load average $load at the start; other work will show in the numbers" >&2
fi
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
# The binary is built from the work tree, which may differ from the commit.
if ! git -C "$ROOT" diff --quiet HEAD -- Cargo.toml Cargo.lock crates 2>/dev/null; then COMMIT="$COMMIT (with uncommitted changes)"; fi
if ((STALE)); then COMMIT="$COMMIT (but the binary was built from older sources)"; fi
python3 - "$WORK/meta.json" "$COMMIT" \
  "$RUNS" "$DURATION" "$CONNS" "$REQS" "$LAT_ROUNDS" \
  "$(nginx -v 2>&1)" "$(wrk -v 2>&1 | head -1)" "$(curl --version | head -1)" <<'PY'
import json, os, sys
keys = ("runs", "duration", "conns", "reqs", "lat_rounds")
meta = dict(zip(keys, map(int, sys.argv[3:8])), commit=sys.argv[2], load_before=os.getloadavg()[0],
            nginx=sys.argv[8], wrk=sys.argv[9], curl=sys.argv[10])
json.dump(meta, open(sys.argv[1], "w"))
PY

# ---- upstream ----------------------------------------------------------------
mkdir -p "$WORK/www" "$WORK/nginx"
chmod 755 "$WORK" "$WORK/www" # nginx's worker runs as www-data
fallocate -l 1G "$WORK/www/1g" 2>/dev/null || head -c 1G /dev/zero >"$WORK/www/1g"
head -c 100 /dev/zero | tr '\0' x >"$WORK/www/small"
cat "$WORK/www/1g" >/dev/null # into the page cache
nginx_conf() { # directory (www/ and nginx/ in it), port
  cat <<EOF
worker_processes 1;
pid $1/nginx/nginx.pid;
error_log $1/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_requests 10000000;
  keepalive_timeout 60s;
  client_body_temp_path $1/nginx/body;
  proxy_temp_path $1/nginx/proxy;
  fastcgi_temp_path $1/nginx/fastcgi;
  uwsgi_temp_path $1/nginx/uwsgi;
  scgi_temp_path $1/nginx/scgi;
  server {
    listen 127.0.0.1:$2;
    root $1/www;
    location / { }
  }
}
EOF
}
PORT=$(free_port)
nginx_conf "$WORK" "$PORT" >"$WORK/nginx/nginx.conf"
setsid nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' 2>>"$WORK/nginx/error.log" &
NGINX=$!
for _ in $(seq 50); do
  curl -s -o /dev/null "http://127.0.0.1:$PORT/small" && break
  sleep 0.1
done
[[ $(curl -s "http://127.0.0.1:$PORT/small") == "$(cat "$WORK/www/small")" ]] || { echo "nginx does not serve" >&2; tail -5 "$WORK/nginx/error.log" >&2; exit 1; }

# ---- daemon and task ----------------------------------------------------------
cat >"$WORK/cairn.toml" <<EOF
[egress]
allow_private = ["127.0.0.0/8"]

[egress.hosts]
"bench.test" = "127.0.0.1:$PORT"
EOF
# Detached from the terminal's process group by setsid, like nginx: a
# Ctrl-C reaches neither, so that the cleanup can still destroy the task
# through the daemon before stopping it.
RUST_LOG=${RUST_LOG:-info} setsid "$CAIRN" serve --config "$WORK/cairn.toml" --listen 127.0.0.1:0 >>"$WORK/daemon.log" 2>&1 &
DAEMON=$!
for _ in $(seq 100); do [[ -s $CAIRN_HOME/url ]] && "$CAIRN" task list >/dev/null 2>&1 && break; sleep 0.1; done
# 2G of memory: the control's 1 GiB file stays in the page cache, which
# the sandbox's cgroup is charged for.
TASK=$("$CAIRN" task create --allow bench.test --cpus 2 --memory 2G)
inside() { "$CAIRN" exec "$TASK" -- "$@"; }

# wrk scripts: the same `done` for every run, printing one JSON line; the
# proxied one asks the proxy for the absolute URL (as any HTTP client set
# to use a proxy does).
cat >"$WORK/done.lua" <<'LUA'
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "mean_us": %.1f, "p50_us": %.1f, "p90_us": %.1f, ' ..
    '"p99_us": %.1f, "p999_us": %.1f, "max_us": %.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
LUA
cp "$WORK/done.lua" "$WORK/direct.lua"
{
  echo 'wrk.path = "http://bench.test/small"'
  echo 'wrk.headers["Host"] = "bench.test"'
  cat "$WORK/done.lua"
} >"$WORK/proxy.lua"
"$CAIRN" cp "$WORK/proxy.lua" "$TASK:/workspace/proxy.lua" >/dev/null
"$CAIRN" cp "$WORK/direct.lua" "$TASK:/workspace/direct.lua" >/dev/null

# The control: the same nginx inside the sandbox, on its own loopback, with
# the same files, for clients in the sandbox that do not use the proxy.
INNER=8080
inside sh -c 'mkdir -p /workspace/www /workspace/nginx && fallocate -l 1G /workspace/www/1g && cat /workspace/www/1g >/dev/null'
"$CAIRN" cp "$WORK/www/small" "$TASK:/workspace/www/small" >/dev/null
{ echo 'user root;'; nginx_conf /workspace "$INNER"; } >"$WORK/inner.conf"
"$CAIRN" cp "$WORK/inner.conf" "$TASK:/workspace/nginx/nginx.conf" >/dev/null
inside sh -c 'nginx -p /workspace/nginx -c /workspace/nginx/nginx.conf </dev/null >/dev/null 2>&1'

# Positive controls: the proxied small file is the file, both ways.
want=$(cat "$WORK/www/small")
[[ $(inside curl -sS --max-time 10 http://bench.test/small) == "$want" ]] || { echo "the proxy does not forward" >&2; exit 1; }
[[ $(inside curl -sS -p --max-time 10 http://bench.test/small) == "$want" ]] || { echo "no CONNECT tunnel through the proxy" >&2; exit 1; }
[[ $(inside curl -sS --noproxy '*' --max-time 10 "http://127.0.0.1:$INNER/small") == "$want" ]] || { echo "no nginx in the sandbox" >&2; exit 1; }

# The decision log: the number of entries for bench.test, once it stops
# growing (an attempt is written when its connection ends, in batches);
# the group's entries since the last call go to the results.
cat >"$WORK/decisions.py" <<'PY'
import collections, json, sys
view = json.load(open(sys.argv[1]))
since, group = int(sys.argv[2]), sys.argv[3]
ds = [d for d in view["decisions"] if d.get("host") == "bench.test"]
new = ds[since:]
if group:
    s = {"entries": len(new), "kinds": collections.Counter(d.get("kind") for d in new),
         "allowed": sum(1 for d in new if d.get("allowed")),
         "statuses": collections.Counter(str(d.get("status")) for d in new),
         "bytes_down": sum(d.get("bytes_down") or 0 for d in new)}
    print(json.dumps({"g": group, "k": "decisions", "v": s}), file=open(sys.argv[4], "a"))
print(len(ds))
PY
LOGGED=0
decisions() { # group: waits for the log to settle, records what the group added
  local n prev=-1
  for _ in $(seq 60); do
    "$CAIRN" --json egress log "$TASK" >"$WORK/egress.json"
    n=$(python3 "$WORK/decisions.py" "$WORK/egress.json" "$LOGGED" "" /dev/null)
    [[ $n == "$prev" ]] && break
    prev=$n
    sleep 0.5
  done
  python3 "$WORK/decisions.py" "$WORK/egress.json" "$LOGGED" "$1" "$RESULTS" >/dev/null
  LOGGED=$n
}
decisions warmup

# ---- throughput ----------------------------------------------------------------
# One 1 GiB download a way per round, the order rotating round by round;
# curl's own figure (bytes over the transfer's time, connection set-up
# included), and the CPU time the daemon and nginx used meanwhile.
FMT='{"code": %{http_code}, "bytes": %{size_download}, "speed": %{speed_download}, "time": %{time_total}}'
download() { # way, round
  local out
  cpu_snap 0
  case $1 in
    direct) out=$(curl -sS -o /dev/null --max-time 300 -w "$FMT" "http://127.0.0.1:$PORT/1g") ;;
    forward) out=$(inside curl -sS -o /dev/null --max-time 300 -w "$FMT" http://bench.test/1g) ;;
    tunnel) out=$(inside curl -sS -p -o /dev/null --max-time 300 -w "$FMT" http://bench.test/1g) ;;
    inside) out=$(inside curl -sS --noproxy '*' -o /dev/null --max-time 300 -w "$FMT" "http://127.0.0.1:$INNER/1g") ;;
  esac
  cpu_snap 1
  python3 - "$out" "$1" <<'PY'
import json, sys
v = json.loads(sys.argv[1])
if v["code"] != 200 or v["bytes"] != 1 << 30:
    sys.exit(f"{sys.argv[2]}: HTTP {v['code']}, {v['bytes']} bytes instead of 1 GiB")
PY
  python3 "$WORK/with_cpu.py" "throughput/$1" run "${out%\}}, \"round\": $2}" "$WORK/cpu.0" "$WORK/cpu.1" >>"$RESULTS"
}
WAYS=(direct forward tunnel inside)
echo "$RUNS rounds of 1 GiB downloads: direct, forwarded, tunnelled, inside the sandbox" >&2
for r in $(seq 0 $((RUNS - 1))); do
  for i in 0 1 2 3; do download "${WAYS[$(((r + i) % 4))]}" "$r"; done
done
decisions throughput

# ---- latency of small requests -------------------------------------------------
# wrk, one thread and one keep-alive connection, the 100-byte file; then
# the same as REQS sequential requests of one curl process.
wrk_run() { # group, where (host or sandbox), then wrk's arguments or a whole command
  local g=$1 where=$2 out
  shift 2
  if [[ $1 != taskset ]]; then set -- wrk "$@"; fi
  cpu_snap 0
  if [[ $where == host ]]; then out=$("$@"); else out=$(inside "$@"); fi
  cpu_snap 1
  out=$(grep '^{' <<<"$out" | tail -1)
  [[ -n $out ]] || { echo "$g: wrk printed no summary" >&2; exit 1; }
  python3 - "$out" "$g" <<'PY'
import json, sys
v = json.loads(sys.argv[1])
if v["requests"] == 0 or v["status"] > v["requests"] / 2:
    sys.exit(f"{sys.argv[2]}: most answers were not 2xx: {v}")
PY
  python3 "$WORK/with_cpu.py" "$g" wrk "$out" "$WORK/cpu.0" "$WORK/cpu.1" >>"$RESULTS"
}
# LAT_ROUNDS rounds, each a DURATION/LAT_ROUNDS run of the three ways in
# turn: on this kind of machine a ping-pong between two processes is much
# faster when the scheduler happens to put them on the same core, and a
# run tends to keep the placement it started with.
PART=$(((DURATION + LAT_ROUNDS - 1) / LAT_ROUNDS))
echo "latency: wrk, 1 connection, $LAT_ROUNDS rounds of ${PART} s a way: direct, proxied, inside the sandbox" >&2
for _ in $(seq "$LAT_ROUNDS"); do
  wrk_run latency/direct host -t1 -c1 -d"${PART}s" -s "$WORK/direct.lua" "http://127.0.0.1:$PORT/small"
  wrk_run latency/forward sandbox -t1 -c1 -d"${PART}s" -s /workspace/proxy.lua http://127.0.0.1:3128/
  wrk_run latency/inside sandbox -t1 -c1 -d"${PART}s" -s /workspace/direct.lua "http://127.0.0.1:$INNER/small"
done
# Then everything on one core (client, nginx, every thread of the daemon):
# no wake-up crosses cores, so what is added is the work done.
echo "latency: the same on one core, ${PART} s a way" >&2
pin() { # cpu list, pids...: every thread of each
  local c=$1 p
  shift
  for p in "$@"; do taskset -a -c -p "$c" "$p" >/dev/null; done
}
ALL=0-$(($(nproc) - 1))
NGINX_WORKERS=$(cat "/proc/$NGINX/task/$NGINX/children")
# shellcheck disable=SC2086
pin 0 "$NGINX" $NGINX_WORKERS "$DAEMON"
wrk_run pinned/direct host taskset -c 0 wrk -t1 -c1 -d"${PART}s" -s "$WORK/direct.lua" "http://127.0.0.1:$PORT/small"
wrk_run pinned/forward sandbox taskset -c 0 wrk -t1 -c1 -d"${PART}s" -s /workspace/proxy.lua http://127.0.0.1:3128/
# shellcheck disable=SC2086
pin "$ALL" "$NGINX" $NGINX_WORKERS "$DAEMON"
decisions latency

curl_seq() { # group, where
  local out
  if [[ $2 == host ]]; then
    out=$(curl -sS -o /dev/null -w '%{http_code} %{time_total}\n' "http://127.0.0.1:$PORT/small?[1-$REQS]")
  elif [[ $2 == sandbox ]]; then
    out=$(inside curl -sS -o /dev/null -w '%{http_code} %{time_total}\n' "http://bench.test/small?[1-$REQS]")
  else
    out=$(inside curl -sS --noproxy '*' -o /dev/null -w '%{http_code} %{time_total}\n' "http://127.0.0.1:$INNER/small?[1-$REQS]")
  fi
  python3 -c '
import json, sys
lines = [l.split() for l in sys.stdin.read().splitlines() if l.strip()]
if len(lines) != int(sys.argv[2]) or any(c != "200" for c, _ in lines):
    sys.exit(f"{sys.argv[1]}: {len(lines)} answers, statuses {sorted(set(c for c, _ in lines))}")
print(json.dumps({"g": sys.argv[1], "k": "curl_s", "v": [float(t) for _, t in lines]}))
' "$1" "$REQS" >>"$RESULTS" <<<"$out"
}
echo "latency: $REQS sequential requests of one curl, direct, proxied, inside the sandbox" >&2
curl_seq latency/direct host
curl_seq latency/forward sandbox
curl_seq latency/inside inner
decisions curl

# ---- connections a second -------------------------------------------------------
# wrk with `Connection: close`: every request on a new connection, CONNS of
# them at a time.
echo "connections a second: wrk, $CONNS connections, Connection: close, ${DURATION} s each way" >&2
wrk_run cps/direct host -t1 -c"$CONNS" -d"${DURATION}s" -H 'Connection: close' -s "$WORK/direct.lua" "http://127.0.0.1:$PORT/small"
wrk_run cps/forward sandbox -t1 -c"$CONNS" -d"${DURATION}s" -H 'Connection: close' -s /workspace/proxy.lua http://127.0.0.1:3128/
wrk_run cps/inside sandbox -t1 -c"$CONNS" -d"${DURATION}s" -H 'Connection: close' -s /workspace/direct.lua "http://127.0.0.1:$INNER/small"
decisions cps

rec daemon rss_kb "$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$DAEMON/status")"
rec daemon threads "$(awk '$1 == "Threads:" { print $2 }' "/proc/$DAEMON/status")"

# ---- report ---------------------------------------------------------------------
if [[ -n ${RAW:-} ]]; then cp "$RESULTS" "$RAW"; cp "$WORK/meta.json" "$RAW.meta.json"; fi
python3 "$ROOT/bench/egress_report.py" "$RESULTS" "$WORK/meta.json" "${WRITE_DOCS[@]}"
