#!/usr/bin/env bash
# Injection benchmark: what an intercepted host (request rule, injected
# secret, the answer scanned for it) costs a client in the sandbox, next to
# a plain CONNECT tunnel to the same upstream and a request straight to it,
# in one run. Requests per second and latency (p50, p99) of small HTTPS
# requests on keep-alive connections.
#
#   bench/inject.sh                # prints the markdown section
#   bench/inject.sh --write-docs   # ... and puts it into docs/benchmarks.md
#   N=3000                         # timed requests of each latency run
#   ROUNDS=5                       # latency runs per way (median of their p50s)
#   SECONDS_RATE=5                 # seconds of each rate run
#   PROCS=4                        # client processes of a rate run
#
# The upstream is an nginx of its own with TLS (a CA of the run's own, made
# with openssl) on an ephemeral loopback port; `/echo` answers with the
# request's Authorization header, so on the intercepted way the secret
# comes back and is scrubbed. The client is the same Python program
# (bench/inject_client.py, http.client over ssl) everywhere: "direct" runs
# on the host against nginx's address and sends the credential itself;
# "tunnel" runs in the sandbox through a CONNECT tunnel to plain.test (no
# rules: the proxy relays the TLS bytes) and also sends it itself;
# "intercepted" runs in the sandbox against api.test, which has
# `--rule 'api.test=GET /'` and `--inject 'api.test=Authorization: Bearer
# {{secret:BENCH_TOKEN}}'`: the client sends no credential. Needs root,
# nginx-light, openssl, python3 (installed when missing) and a release
# build of cairn (built when missing).
set -euo pipefail
shopt -s inherit_errexit
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-3000}
ROUNDS=${ROUNDS:-5}
SECONDS_RATE=${SECONDS_RATE:-5}
PROCS=${PROCS:-4}
WRITE_DOCS=0
for a in "$@"; do
  case $a in
    --write-docs) WRITE_DOCS=1 ;;
    *) echo "usage: $0 [--write-docs]" >&2; exit 2 ;;
  esac
done

need=()
for p in python3:python3 nginx:nginx-light openssl:openssl curl:curl; do
  command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if ((${#need[@]})); then
  apt-get update -qq && RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
(cd "$ROOT" && cargo build --release --locked -q -p cairn-cli)

WORK=$(mktemp -d /var/tmp/cairn-injectbench.XXXXXX)
cp "$ROOT/target/release/cairn" "$WORK/cairn"
CAIRN=$WORK/cairn
export CAIRN_HOME=$WORK/home
TASK=
DAEMON=
NGINX=
cleanup() {
  if [[ -n $TASK ]]; then "$CAIRN" destroy "$TASK" >/dev/null 2>&1 || true; fi
  if [[ -n $DAEMON ]]; then kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true; fi
  if [[ -n $NGINX ]]; then kill -QUIT "$NGINX" 2>/dev/null && wait "$NGINX" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git -C "$ROOT" diff --quiet HEAD -- Cargo.toml Cargo.lock crates 2>/dev/null; then COMMIT="$COMMIT (with uncommitted changes)"; fi

# ---- upstream: nginx with TLS ------------------------------------------------
mkdir -p "$WORK/nginx" "$WORK/tls"
chmod 755 "$WORK"
(
  cd "$WORK/tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-upstream-ca 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key -out leaf.csr -subj /CN=api.test 2>/dev/null
  printf 'subjectAltName=DNS:api.test,DNS:plain.test,IP:127.0.0.1\n' >ext
  openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 2 -extfile ext 2>/dev/null
  chmod 644 ./*
)
PORT=$(free_port)
cat >"$WORK/nginx/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  keepalive_timeout 60s;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  server {
    listen 127.0.0.1:$PORT ssl http2;
    ssl_certificate $WORK/tls/leaf.pem;
    ssl_certificate_key $WORK/tls/leaf.key;
    location /echo { default_type text/plain; return 200 "auth=\$http_authorization\n"; }
  }
}
EOF
setsid nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' 2>>"$WORK/nginx/error.log" &
NGINX=$!
for _ in $(seq 50); do
  curl -s --cacert "$WORK/tls/ca.pem" -o /dev/null "https://127.0.0.1:$PORT/echo" && break
  sleep 0.1
done
curl -sf --cacert "$WORK/tls/ca.pem" "https://127.0.0.1:$PORT/echo" >/dev/null || { echo "nginx does not serve" >&2; tail -5 "$WORK/nginx/error.log" >&2; exit 1; }

# ---- daemon, secret, task ------------------------------------------------------
cat >"$WORK/cairn.toml" <<EOF
[egress]
allow_private = ["127.0.0.0/8"]
upstream_ca = "$WORK/tls/ca.pem"

[egress.hosts]
"api.test" = "127.0.0.1:$PORT"
"plain.test" = "127.0.0.1:$PORT"
EOF
setsid "$CAIRN" serve --config "$WORK/cairn.toml" --listen 127.0.0.1:0 >>"$WORK/daemon.log" 2>&1 &
DAEMON=$!
for _ in $(seq 100); do [[ -s $CAIRN_HOME/url ]] && "$CAIRN" task list >/dev/null 2>&1 && break; sleep 0.1; done
SECRET=bench-secret-0123456789abcdef
printf %s "$SECRET" | "$CAIRN" secret set BENCH_TOKEN >/dev/null
TASK=$("$CAIRN" --json task create --cpus 2 --memory 1G --allow api.test --allow plain.test \
  --rule 'api.test=GET /' --inject 'api.test=Authorization: Bearer {{secret:BENCH_TOKEN}}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
"$CAIRN" cp "$ROOT/bench/inject_client.py" "$TASK:/workspace/client.py" >/dev/null
"$CAIRN" cp "$WORK/tls/ca.pem" "$TASK:/workspace/up-ca.pem" >/dev/null
CLIENT_HOST=$WORK/client.py
cp "$ROOT/bench/inject_client.py" "$CLIENT_HOST"

direct() { python3 "$CLIENT_HOST" "$1" 127.0.0.1 "$PORT" "$WORK/tls/ca.pem" "${@:2}" "" "Bearer $SECRET"; }
tunnel() { "$CAIRN" exec "$TASK" -- python3 /workspace/client.py "$1" plain.test 443 /workspace/up-ca.pem "${@:2}" 3128 "Bearer $SECRET"; }
intercepted() { "$CAIRN" exec "$TASK" -- python3 /workspace/client.py "$1" api.test 443 /etc/cairn/ca-bundle.pem "${@:2}" 3128; }

# The intercepted way must work as described before it is measured.
check=$(intercepted latency 1 2>&1 || true)
case $check in
  *'Bearer $BENCH_TOKEN'*) ;;
  *) echo "the intercepted echo is not scrubbed: $check" >&2; exit 1 ;;
esac
case $check in *"$SECRET"*) echo "the secret came back: $check" >&2; exit 1 ;; esac

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
for round in $(seq "$ROUNDS"); do
  # Interleaved, so that drift in the machine's state touches every way.
  for way in direct tunnel intercepted; do
    printf '{"way": "%s", "kind": "latency", "r": %s}\n' "$way" "$($way latency "$N")" >>"$RESULTS"
  done
done
# The daemon's CPU time (user + system, in clock ticks) over each rate run.
daemon_ticks() { awk '{print $14 + $15}' "/proc/$DAEMON/stat"; }
TICK=$(getconf CLK_TCK)
for round in 1 2 3; do
  for way in direct tunnel intercepted; do
    before=$(daemon_ticks)
    r=$($way rate "$SECONDS_RATE" "$PROCS")
    printf '{"way": "%s", "kind": "rate", "r": %s, "daemon_ticks": %s, "tick_hz": %s}\n' "$way" "$r" "$(( $(daemon_ticks) - before ))" "$TICK" >>"$RESULTS"
  done
done

python3 - "$RESULTS" "$COMMIT" "$N" "$ROUNDS" "$SECONDS_RATE" "$PROCS" "$WRITE_DOCS" "$ROOT" <<'PY'
import json, statistics, sys, os
sys.path.insert(0, os.path.join(sys.argv[8], "bench"))
rows = [json.loads(l) for l in open(sys.argv[1])]
commit, n, rounds, secs, procs, write = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), sys.argv[7] == "1"
ways = ["direct", "tunnel", "intercepted"]
lat = {w: [r["r"] for r in rows if r["way"] == w and r["kind"] == "latency"] for w in ways}
rate = {w: [r["r"]["rps"] for r in rows if r["way"] == w and r["kind"] == "rate"] for w in ways}
p50 = {w: statistics.median(x["p50_us"] for x in lat[w]) for w in ways}
p99 = {w: statistics.median(x["p99_us"] for x in lat[w]) for w in ways}
rps = {w: statistics.median(rate[w]) for w in ways}
# The daemon's CPU per request (µs) in the rate runs.
cpu = {w: statistics.median(r["daemon_ticks"] / r["tick_hz"] * 1e6 / r["r"]["requests"] for r in rows if r["way"] == w and r["kind"] == "rate") for w in ways}
us = lambda v: f"{v:,.0f} µs"
lines = [
    "## Injection: an intercepted host",
    "",
    "`bench/inject.sh`, in one run: small HTTPS requests (`GET /echo`, which an nginx with TLS on",
    "loopback answers with the request's `Authorization` header) on keep-alive connections, from the",
    "same Python client (`http.client` over `ssl`) three ways. *Direct*: on the host, straight to",
    "nginx, sending the credential itself. *Tunnel*: in a task's sandbox, through a CONNECT tunnel to",
    "`plain.test` (no rules: the proxy relays the TLS bytes), sending it itself. *Intercepted*: in the",
    "sandbox, to `api.test`, which has `--rule 'api.test=GET /'` and `--inject 'api.test=Authorization:",
    "Bearer {{secret:BENCH_TOKEN}}'`: the client sends no credential, the proxy ends its TLS with the",
    "task's CA, checks the rule, injects the secret, sends the request over its own verified TLS",
    "connection, and scans the answer, which holds the secret, replacing it with `$BENCH_TOKEN`.",
    f"Latency: {n:,} timed requests on one connection, {rounds} rounds per way (interleaved), the",
    f"median of the rounds' p50 and p99. Requests a second: {procs} client processes, each on its own",
    f"connection, {secs} s, 3 rounds, the median. Commit {commit}.",
    "",
    "| way | requests/s | p50 | p99 | p50 added to the tunnel's | requests/s against the tunnel's | daemon CPU a request |",
    "|---|---|---|---|---|---|---|",
]
for w in ways:
    added = "" if w != "intercepted" else f"**{p50[w] - p50['tunnel']:+,.0f} µs**"
    ratio = f"{rps[w] / rps['tunnel']:.2f}×"
    daemon = "(not through it)" if w == "direct" else us(cpu[w])
    lines.append(f"| {w} | {rps[w]:,.0f} | {us(p50[w])} | {us(p99[w])} | {added} | {ratio} | {daemon} |")
added, ratio = p50["intercepted"] - p50["tunnel"], rps["intercepted"] / rps["tunnel"]
verdict = lambda ok: "met" if ok else "**not met**"
lines += [
    "",
    f"Goals of the issue: under 1 ms added at p50: {verdict(added < 1000)} ({added:,.0f} µs over the tunnel,",
    f"{p50['intercepted'] - p50['direct']:,.0f} µs over direct); at least half the tunnel's throughput: {verdict(ratio >= 0.5)}",
    f"({ratio:.2f}×). On these 2 cores the client processes, nginx and the daemon share the CPU, so",
    "requests a second measure CPU per request: an intercepted request costs the proxy two TLS",
    "sessions' crypto, two HTTP parses, the scan, and one entry in the task's decision log (a row in",
    "the store's hash-chained event log, per request, where a tunnel writes one per connection;",
    "the writer gathers them for 10 ms into one transaction, each task's entries written 200 to a",
    "statement). The last column is the daemon's CPU time (user and system) over the rate runs",
    "divided by the requests: what the proxy itself costs, which moves less from run to run than",
    "the ratio (the tunnel's own rate moved between 10,700 and 14,300 a second across runs on this",
    "machine). A profile of the daemon during the intercepted rate run is spread thin: TLS,",
    "HTTP/1.1 from the client and HTTP/2 to nginx, JSON and the chain hash of each decision, and",
    "the kernel's TCP, none of them a large share; a tunnel's bytes move by `splice` without",
    "waking the daemon per request.",
    "",
    "The ratio moves with the host more than with the proxy. Earlier runs on this machine gave",
    "0.39× (before a host's scrubber was kept between requests) and 0.50× (commit b0028e6: 5,683",
    "requests a second against the tunnel's 11,391, 135 µs and 26 µs of daemon CPU a request). On",
    "2026-12-07 the same build gave 0.65× (4,388 against 6,714): that day the tunnel cost the daemon",
    "74 µs a request, three times as much, and the intercepted way 189 µs, 1.4 times as much, so",
    "the host's cost of the tunnel's wakes and `splice` calls rose more than that of the proxy's",
    "own work. Also measured that day and not kept: offering the upstream HTTP/2 only when the",
    "client chose it (nginx otherwise takes HTTP/2, and each HTTP/1.1 request goes out as an",
    "HTTP/2 stream) gave 0.62× and 198 µs, no gain over the build without it.",
    "",
]
section = "\n".join(lines)
print(section)
if write:
    from section import write_section
    write_section(os.path.join(sys.argv[8], "docs/benchmarks.md"), section)
PY
