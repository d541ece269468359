"""Turns bench/egress.sh's measurements into the "## Egress proxy" section of
docs/benchmarks.md.

    egress_report.py RESULTS.jsonl META.json [--write-docs DOC]

RESULTS.jsonl has one measurement a line: {"g": group, "k": key, "v": value}.
The section goes to stdout; with --write-docs it also replaces the
"## Egress proxy" section of DOC (or is appended to it), leaving the rest of
DOC as it is.
"""
import datetime
import json
import math
import os
import platform
import re
import statistics
import sys
import textwrap
from collections import defaultdict

from machine import cpu_model, mem_total

HEADING = "## Egress proxy"
GIB = 1 << 30

args = sys.argv[1:]
doc = None
if "--write-docs" in args:
    i = args.index("--write-docs")
    doc = args[i + 1]
    del args[i:i + 2]
results_path, meta_path = args
meta = json.load(open(meta_path))

rows = defaultdict(list)  # (group, key) -> values
for line in open(results_path):
    r = json.loads(line)
    rows[(r["g"], r["k"])].append(r["v"])


def one(group, key, default=None):
    v = rows.get((group, key))
    return v[-1] if v else default


def pct(xs, p):
    """Nearest rank: the smallest value with at least p % of them at or below."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def us(x):
    """Microseconds, readably."""
    if x is None:
        return "–"
    if x < 0:
        return "−" + us(-x)
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.0f} µs"


def met(ok):
    return "**met**" if ok else "**not met**"


out = []
p = out.append


def para(*parts, indent=""):
    """One paragraph, wrapped, then an empty line (unless it is a list item)."""
    text = " ".join(parts)
    first = indent[:-2] + "- " if indent else ""
    p(textwrap.fill(text, width=96, initial_indent=first, subsequent_indent=indent,
                    break_long_words=False, break_on_hyphens=False) + ("" if indent else "\n"))


WAYS = ("direct", "forward", "tunnel", "inside")
runs = {w: rows.get((f"throughput/{w}", "run"), []) for w in WAYS}
mbs = {w: [v["speed"] / 1e6 for v in rs] for w, rs in runs.items()}
med = {w: statistics.median(xs) for w, xs in mbs.items() if xs}
seq = {w: [t * 1e6 for t in one(f"latency/{w}", "curl_s", [])] for w in WAYS}
cps = {w: one(f"cps/{w}", "wrk") for w in WAYS}
dec = {g: one(g, "decisions", {}) for g in ("throughput", "latency", "curl", "cps")}
labels = {"direct": "direct (host → nginx)", "forward": "forwarded by the proxy", "tunnel": "CONNECT tunnel",
          "inside": "control: in the sandbox, no proxy"}


def rate(v):
    return v["requests"] / (v["duration_us"] / 1e6)


def daemon_cpu(v, per, unit):
    """The daemon's CPU per `per` (its SQLite threads' share in brackets)."""
    if v["daemon_cpu_s"] < 0.05:
        return "–"
    return f"{unit(v['daemon_cpu_s'] / per)} ({unit(v['sqlite_cpu_s'] / per)})"


def secs(x):
    return f"{x:.2f} s"


def usecs(x):
    return us(x * 1e6)


p(f"{HEADING}\n")
para("A sandbox has only `lo`; its way out is the daemon's HTTP proxy on 127.0.0.1:3128 inside",
     "its network namespace, which forwards plain `http://` requests (absolute-form) and tunnels",
     "`CONNECT`, and writes every attempt to the task's log as an `egress` decision.",
     "`bench/egress.sh` measures what that costs against the same transfer without the proxy, on",
     "loopback, all in one run (`--write-docs` rewrites this section).")
para("The upstream is an nginx of the script's own (one worker, `sendfile on`, access log off,",
     "unlimited keep-alive requests) on an ephemeral loopback port, serving a 1 GiB file (in the",
     "page cache) and a 100-byte one. *Direct* clients run on the host against its port.",
     "*Proxied* ones run inside one task's sandbox (`--cpus 2 --memory 2G --allow bench.test`, so",
     "that its cgroup neither throttles them nor evicts the control's file below), through the",
     "proxy, which the daemon's config",
     "(`[egress.hosts]`, `allow_private = [\"127.0.0.0/8\"]`) resolves `bench.test` to nginx's",
     "port. The *control* runs the same nginx, config and files inside the sandbox, on its own",
     "loopback, for clients in the sandbox that bypass the proxy (`--noproxy '*'`): what the",
     "sandbox itself costs a client, without the proxy. Same client binaries everywhere; the",
     "daemon at its default log level (info). CPU is user + system time from `/proc/PID/stat`",
     "over each measurement: the daemon's (in brackets, its SQLite worker threads' share) and",
     "nginx's (master and worker, host instance).")
p(f"- date: {datetime.date.today().isoformat()}")
p(f"- machine: {os.cpu_count()} cores, {cpu_model()}, {mem_total()}, kernel {platform.release()}")
p(f"- commit: {meta.get('commit', 'unknown')}; load average before the run: {meta['load_before']:.2f}")
p(f"- clients and upstream: {meta['curl'].split(' (')[0]}, {meta['wrk'].split(' [')[0]}, "
  f"{meta['nginx'].replace('nginx version: ', '')}\n")

# Throughput.
para(f"**Throughput**: one 1 GiB download a way per round, {meta['runs']} rounds, the order of the",
     "ways rotating round by round. `curl -o /dev/null`, its `speed_download` (bytes over the",
     "transfer's time, connection set-up included); MB = 10⁶ bytes. *Forwarded*:",
     "`curl http://bench.test/1g` with the proxy variables the sandbox is given; *tunnelled*: the",
     "same with `curl -p`, a `CONNECT bench.test:80` tunnel (no TLS, so the proxy relays the",
     "bytes as they are).")
para("*vs direct* is the ratio of the medians; *per round* the median (and range) of each",
     "round's ratio to that round's direct download, taken seconds apart: the transfer rate of",
     "this virtual machine's loopback drifts by tens of percent from one minute to the next.")
p("| 1 GiB download | median | min | max | vs direct | per round | daemon CPU / GiB | nginx CPU / GiB |")
p("|---|---:|---:|---:|---:|---:|---:|---:|")
by_round = defaultdict(dict)  # round -> way -> MB/s
for w in WAYS:
    for v in runs[w]:
        by_round[v.get("round")][w] = v["speed"] / 1e6
round_ratio = {w: [r[w] / r["direct"] for r in by_round.values() if w in r and "direct" in r] for w in WAYS}
cpu = {}
for w in WAYS:
    if not mbs[w]:
        continue
    d = statistics.median(v["daemon_cpu_s"] for v in runs[w])
    q = statistics.median(v["sqlite_cpu_s"] for v in runs[w])
    n = statistics.median(v["nginx_cpu_s"] for v in runs[w])
    t = statistics.median(v["time"] for v in runs[w])
    cpu[w] = (d, n, t)
    ratio = f"{med[w] / med['direct'] * 100:.0f} %" if "direct" in med else "–"
    rr = round_ratio[w]
    per = "–" if w == "direct" or not rr else \
        f"{statistics.median(rr) * 100:.0f} % ({min(rr) * 100:.0f}–{max(rr) * 100:.0f} %)"
    p(f"| {labels[w]} | **{med[w]:,.0f} MB/s** | {min(mbs[w]):,.0f} | {max(mbs[w]):,.0f} | {ratio} | {per} | "
      + (f"{secs(d)} ({secs(q)})" if w in ("forward", "tunnel") else "–") + " | "
      + (secs(n) if w != "inside" else "–") + " |")
p("")

# Latency.
rounds = {w: rows.get((f"latency/{w}", "wrk"), []) for w in WAYS}
pinned = {w: one(f"pinned/{w}", "wrk") for w in WAYS}


def summary(vs):
    """Medians over rounds, the range of p50, and totals for the CPU per request."""
    if not vs:
        return None
    n = sum(v["requests"] for v in vs)
    return {"rate": statistics.median(rate(v) for v in vs),
            **{k: statistics.median(v[k] for v in vs) for k in ("p50_us", "p90_us", "p99_us", "p999_us", "mean_us")},
            "p50_lo": min(v["p50_us"] for v in vs), "p50_hi": max(v["p50_us"] for v in vs),
            "requests": n, "rounds": len(vs),
            "daemon_cpu_s": sum(v["daemon_cpu_s"] for v in vs), "sqlite_cpu_s": sum(v["sqlite_cpu_s"] for v in vs),
            "daemon_user_s": sum(v.get("daemon_user_s", 0) for v in vs),
            "daemon_switches": sum(v.get("daemon_switches", 0) for v in vs),
            "nginx_cpu_s": sum(v["nginx_cpu_s"] for v in vs)}


lat = {w: summary(rounds[w]) for w in WAYS}
one_core = {w: summary([pinned[w]] if pinned[w] else []) for w in WAYS}


def lat_row(label, v, w):
    rng = f" ({us(v['p50_lo'])}–{us(v['p50_hi'])})" if v["rounds"] > 1 else ""
    d = f"{us(v['daemon_cpu_s'] * 1e6 / v['requests'])} ({us(v['sqlite_cpu_s'] * 1e6 / v['requests'])})" \
        if w == "forward" else "–"
    sw = f"{v['daemon_switches'] / v['requests']:.1f}" if w == "forward" else "–"
    ng = us(v["nginx_cpu_s"] * 1e6 / v["requests"]) if w != "inside" else "–"
    p(f"| {label} | {v['rate']:,.0f} | {us(v['p50_us'])}{rng} | {us(v['p90_us'])} | {us(v['p99_us'])} | "
      f"{d} | {sw} | {ng} |")


def added_row(label, a, b):
    p(f"| **{label}** | | **{us(b['p50_us'] - a['p50_us'])}** | {us(b['p90_us'] - a['p90_us'])} | "
      f"{us(b['p99_us'] - a['p99_us'])} | | | |")


part = -(-meta["duration"] // meta["lat_rounds"])
para(f"**Small requests**: `wrk -t1 -c1`, one keep-alive connection asking for the 100-byte file",
     "as fast as it answers: direct against nginx's port; from inside the sandbox against the",
     "proxy with the absolute URL (a Lua script sets `wrk.path = \"http://bench.test/small\"` and",
     "the `Host` header); and the control. wrk's percentiles (its latency histogram, read by a",
     f"`done` function), in {meta['lat_rounds']} rounds of {part} s a way, the three ways in turn;",
     "the table gives the medians over the rounds (for p50 also the lowest and highest round).",
     "*Added* is proxied minus direct. On this virtual machine a request and its answer between",
     "two processes on different cores cost a cross-core wake-up each way, tens of µs (the",
     "guest does not poll before it halts); whether a run got one core or two for its pair is",
     "up to the scheduler, hence the rounds. The *one core* rows pin everything (wrk, nginx,",
     f"every thread of the daemon) to the first core for one more {part} s run a way: no",
     "wake-up crosses cores there, so what the proxy adds is the work it does. The daemon's",
     "*sleeps* are its threads' voluntary context switches per request. Cross-checked with",
     f"{meta['reqs']} sequential requests of one `curl` process (one connection, reused; the",
     "`time_total` of each).")
p("| small requests, 1 connection | requests/s | p50 | p90 | p99 | daemon CPU / request | daemon sleeps / request | nginx CPU / request |")
p("|---|---:|---:|---:|---:|---:|---:|---:|")
for w in ("direct", "forward", "inside"):
    if lat[w]:
        lat_row(f"wrk, {labels[w]}", lat[w], w)
if lat["direct"] and lat["forward"]:
    added_row("added by the proxy", lat["direct"], lat["forward"])
for w in ("direct", "forward"):
    if one_core[w]:
        lat_row(f"wrk, one core, {labels[w]}", one_core[w], w)
if one_core["direct"] and one_core["forward"]:
    added_row("added by the proxy, one core", one_core["direct"], one_core["forward"])
for w in ("direct", "forward", "inside"):
    xs = seq[w]
    if xs:
        p(f"| curl ×{len(xs)}, {labels[w]} | | {us(pct(xs, 50))} | {us(pct(xs, 90))} | {us(pct(xs, 99))} | | | |")
if seq["direct"] and seq["forward"]:
    a, b = seq["direct"], seq["forward"]
    p(f"| **added (curl)** | | **{us(pct(b, 50) - pct(a, 50))}** | {us(pct(b, 90) - pct(a, 90))} | "
      f"{us(pct(b, 99) - pct(a, 99))} | | | |")
p("")

# Connections a second.
para(f"**New connections a second**: `wrk -t1 -c{meta['conns']} -d{meta['duration']}s -H 'Connection: close'`,",
     "so that every request opens a connection (to nginx, or to the proxy, which opens one to",
     "nginx for it), the same three ways.")
p("| new connection per request | connections/s | vs direct | p50 | p99 | daemon CPU / connection | socket errors |")
p("|---|---:|---:|---:|---:|---:|---:|")
for w in ("direct", "forward", "inside"):
    v = cps[w]
    if not v:
        continue
    ratio = f"{rate(v) / rate(cps['direct']) * 100:.0f} %" if cps["direct"] else "–"
    errs = str(v["connect"] + v["read"] + v["write"] + v["timeout"])
    if v["status"]:
        errs += f" (and {v['status']} not 2xx)"
    p(f"| {labels[w]} | **{rate(v):,.0f}** | {ratio} | {us(v['p50_us'])} | {us(v['p99_us'])} | "
      f"{daemon_cpu(v, v['requests'], usecs) if w == 'forward' else '–'} | {errs} |")
p("")


def entries(g):
    return dec.get(g, {}).get("entries")


logged = []
if dec.get("throughput"):
    logged.append(f"{entries('throughput')} for the {len(runs['forward']) + len(runs['tunnel'])} proxied downloads "
                  f"({dec['throughput'].get('bytes_down', 0) / GIB:.1f} GiB down in all)")
if lat["forward"] and dec.get("latency"):
    n = lat["forward"]["requests"] + (one_core["forward"]["requests"] if one_core["forward"] else 0)
    logged.append(f"{entries('latency'):,} for wrk's {n:,} requests on one connection (a new one each round)")
if seq["forward"] and dec.get("curl"):
    logged.append(f"{entries('curl'):,} for curl's {len(seq['forward'])} on one connection")
if cps["forward"] and dec.get("cps"):
    logged.append(f"{entries('cps'):,} for the {cps['forward']['requests']:,} requests on new connections")
per_request = (lat["forward"] and dec.get("latency") and entries("latency") >= lat["forward"]["requests"])
if logged:
    para(("Each forwarded request (on a keep-alive connection too, where each is checked on its own)"
          if per_request else "Each proxied connection"),
         "and each tunnel also writes a decision-log entry: an `egress` event in the task's log,",
         "handed to a writer that commits up to 256 at a time in one SQLite transaction, off the",
         "request's path. Entries for `bench.test` afterwards (`cairn --json egress log`):",
         "; ".join(logged) + ".")

# Where the time goes.
notes = []
if "forward" in cpu and "direct" in cpu:
    d, n, t = cpu["forward"]
    notes.append(f"forwarding a GiB took {d:.2f} s of the daemon's CPU ({d / t:.2f} of a core over "
                 f"the {t:.2f} s transfer)")
if "tunnel" in cpu:
    d, n, t = cpu["tunnel"]
    notes.append(f"tunnelling it {d:.2f} s ({d / t:.2f} of a core)")
if round_ratio["inside"]:
    c = statistics.median(round_ratio["inside"])
    notes.append(f"the control, client and nginx both in the sandbox, reached {c * 100:.0f} % of direct "
                 "(median of the rounds), so the sandbox itself (namespaces, cgroup, seccomp filter) costs "
                 "a client little and the gap is the proxy's" if c >= 0.9 else
                 f"the control, client and nginx both in the sandbox, reached {c * 100:.0f} % of direct "
                 "(median of the rounds), so part of the gap may be the sandbox's own, not the proxy's")
if notes:
    para("Where the time goes: " + "; ".join(notes) + ". Through the proxy every byte crosses",
         "loopback twice (nginx → daemon, daemon → client),",
         f"on {os.cpu_count()} cores that the client, nginx and the daemon share. Forwarded bytes pass",
         "through the daemon's user space (hyper's HTTP/1 client and server); tunnelled ones do not:",
         "the tunnel moves them with splice(2), socket to pipe to socket, one pipe per direction.")
if lat["forward"] and lat["direct"]:
    v = lat["forward"]
    nd = lat["direct"]["nginx_cpu_s"] * 1e6 / lat["direct"]["requests"]
    para(f"For a small request on a keep-alive connection the daemon spent {us(v['daemon_cpu_s'] * 1e6 / v['requests'])}",
         f"of CPU ({us(v['sqlite_cpu_s'] * 1e6 / v['requests'])} of it in its SQLite threads writing the decision log;",
         f"{us((v['daemon_cpu_s'] - v['daemon_user_s']) * 1e6 / v['requests'])} of it in the kernel)",
         f"and its threads slept and woke {v['daemon_switches'] / v['requests']:.1f} times; nginx spends",
         f"{us(nd)} a request. Each forwarded request also goes to nginx over a new upstream",
         "connection of its own (connect, HTTP/1 handshake, close) even when the client keeps its",
         "connection to the proxy alive, so the keep-alive case pays for a connection per request too.")

# Against the goals.
p("Against the goals:\n")
goals = []
if "direct" in med:
    for w in ("forward", "tunnel"):
        if w in med:
            r = med[w] / med["direct"]
            goals.append(f"at least 90 % of direct throughput, {'tunnelled' if w == 'tunnel' else 'forwarded'}: "
                         f"{med[w]:,.0f} MB/s against {med['direct']:,.0f} MB/s, {r * 100:.0f} %, {met(r >= 0.9)};")
if lat["direct"] and lat["forward"]:
    added = (lat["forward"]["p50_us"] - lat["direct"]["p50_us"]) / 1000
    added99 = (lat["forward"]["p99_us"] - lat["direct"]["p99_us"]) / 1000
    extra = []
    if one_core["direct"] and one_core["forward"]:
        extra.append(f"{(one_core['forward']['p50_us'] - one_core['direct']['p50_us']) / 1000:.3f} ms on one core")
    if seq["direct"] and seq["forward"]:
        extra.append(f"{(pct(seq['forward'], 50) - pct(seq['direct'], 50)) / 1000:.3f} ms by curl")
    extra.append(f"p99 {added99:.3f} ms added")
    goals.append(f"under 1 ms added per request: p50 {added:.3f} ms added (" + "; ".join(extra) + f"), "
                 f"{met(added < 1)}" + ("" if added99 < 1 else " at the median, not at p99") + ";")
if cps["direct"] and cps["forward"]:
    goals.append(f"(no goal) new connections: {rate(cps['forward']):,.0f}/s through the proxy against "
                 f"{rate(cps['direct']):,.0f}/s direct, {rate(cps['forward']) / rate(cps['direct']) * 100:.0f} %.")
for g in goals:
    para(g, indent="  ")
p("")
p("Reproduce: `bench/egress.sh` (prints this section; `--write-docs` puts it here), with")
p(f"`RUNS={meta['runs']} DURATION={meta['duration']} LAT_ROUNDS={meta['lat_rounds']} CONNS={meta['conns']} "
  f"REQS={meta['reqs']}` as above.")

section = "\n".join(out).rstrip("\n") + "\n"
sys.stdout.write(section)

if doc:
    # Read right before writing: others may have changed other sections.
    text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
    m = re.search(r"^## Egress proxy\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
    if m:
        text = text[:m.start()] + section + ("\n" if m.end() < len(text) else "") + text[m.end():]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(doc, "w").write(text)
    print(f"wrote the Egress proxy section of {os.path.basename(doc)}", file=sys.stderr)
