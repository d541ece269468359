"""Turns bench/wake.sh's measurements into the "## Suspend and wake" section
of docs/benchmarks.md.

    wake_report.py RESULTS.jsonl META.json [--write-docs DOC]

RESULTS.jsonl has one measurement a line: {"g": group, "k": key, "v": value}.
The section goes to stdout; with --write-docs it also replaces the
"## Suspend and wake" section of DOC (or is appended to it), leaving the
rest of DOC as it is.
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

HEADING = "## Suspend and wake"
SIZES = ("10", "200")

args = sys.argv[1:]
doc = None
if "--write-docs" in args:
    i = args.index("--write-docs")
    doc = args[i + 1]
    del args[i:i + 2]
results_path, meta_path = args
meta = json.load(open(meta_path))

rows = defaultdict(list)  # (group, key) -> values
order = []  # groups in the order they were measured
for line in open(results_path):
    r = json.loads(line)
    rows[(r["g"], r["k"])].append(r["v"])
    if r["g"] not in order:
        order.append(r["g"])


def one(group, key, default=None):
    v = rows.get((group, key))
    return v[-1] if v else default


def pct(xs, p):
    """Nearest rank: the smallest value with at least p % of them at or below."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def ms(x):
    if x is None:
        return "–"
    return f"{x / 1000:.2f} s" if x >= 1000 else f"{x:.0f} ms" if x >= 100 else f"{x:.1f} ms"


def stats(xs):
    return [ms(pct(xs, 50)), ms(pct(xs, 90)), ms(pct(xs, 99)), ms(max(xs))] if xs else ["–"] * 4


def kib(x):
    if x >= 1024 * 1024:
        return f"{x / 1024 / 1024:.2f} GiB"
    return f"{x / 1024:.1f} MiB" if x >= 1024 else f"{x:.0f} KiB"




def wakes(group):
    return rows.get((group, "wake"), [])


def client_ms(group):
    return [v / 1000 for v in rows.get((group, "e2e_us"), [])]


def median(xs):
    xs = list(xs)
    return statistics.median(xs) if xs else None


out = []
p = out.append


def para(*parts, indent=""):
    """One paragraph, wrapped, then an empty line (unless it is a list item)."""
    text = " ".join(parts)
    first = indent[:-2] + "- " if indent else ""
    p(textwrap.fill(text, width=96, initial_indent=first, subsequent_indent=indent,
                    break_long_words=False, break_on_hyphens=False) + ("" if indent else "\n"))


# Sandbox start timings from the daemon's debug log, matched to the wakes of
# each size's task: its first start is the create, then one per wake, in the
# order the groups ran. A create's start (other tasks) uses a helper started
# ahead.
starts = defaultdict(list)
for v in rows.get(("start", "timing"), []):
    starts[v["task"].strip('"')].append(v)
start_of = defaultdict(list)  # group -> timings of its wakes
for size in SIZES:
    seq = starts.get(one(size, "task"), [])[1:]
    for g in [g for g in order if g.startswith(size + "/")]:
        n = len(wakes(g))
        start_of[g], seq = seq[:n], seq[n:]
wake_tasks = {one(size, "task") for size in SIZES}
create_helper = [vs[0]["helper"] - vs[0]["cgroup"] for t, vs in starts.items() if t not in wake_tasks and vs]

p(f"{HEADING}\n")
para("A task that waits for an event is snapshotted (kind `suspend`) and its sandbox destroyed;",
     "the event wakes it into a fresh sandbox. `bench/wake.sh` reproduces all of this",
     "(`--write-docs` rewrites this section), on one daemon (`--disk-pool 4`) in a new home.")
para("Wakes: two tasks (1 GB disk) whose workspace is ten files of random data, 10 MB and 200 MB",
     "in all. Each cycle appends 4 KB to a file (a step of work), runs `cairn wait --webhook go`",
     "(it returns once the task is `suspended`), `cairn event --name go`, then",
     "`cairn exec ID -- true`, which waits for the wake; the two sizes alternate cycle by cycle, so",
     "both see the same background. The daemon's figure is `event_accepted_to_ready_ms` of the",
     "`wake` event in the task's log: from the request with the event to the new sandbox's init",
     "answering, its files in place. The client's is from starting `cairn event` to",
     "`cairn exec` having exited, two CLI processes included.",
     f"{meta['wakes']} cycles per size and trigger, so p99 is the largest value or the largest but one",
     "(nearest rank). The `cached` column counts the wakes that found the task's disk image as",
     "the suspend left it (the fast path); the workspace's hash was checked after the last wake",
     "of each size. Medians moved by up to about 25 % between runs on this virtual machine, which",
     "other work shares; compare within one run.")

p(f"- date: {datetime.date.today().isoformat()}")
p(f"- machine: {os.cpu_count()} cores, {cpu_model()}, {mem_total()}, kernel {platform.release()}")
p(f"- commit: {meta.get('commit', 'unknown')}; load average before the run: {meta['load_before']:.2f}\n")

p("| wake | n | cached | daemon p50 | p90 | p99 | max | client p50 | p90 | p99 | max |")
p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
labels = {"event": "by `cairn event`", "approval": "by `cairn approve`", "resume": "by `cairn resume`",
          "blob": "from the blob store, no local disk"}
cached_p50 = {}  # size -> daemon figures of its cached wakes by event
for g in order:
    if "/" not in g or g.split("/")[1] not in labels or not wakes(g):
        continue
    size, trig = g.split("/")
    w = wakes(g)
    hits = sum(1 for v in w if v.get("from_cache"))
    # A wake by resume has no event: its figure starts when the wake does.
    key = "sandbox_ready_ms" if trig == "resume" else "event_accepted_to_ready_ms"
    daemon = [v[key] for v in w if v.get(key) is not None and v.get("exit_code") == 0]
    if trig == "event":
        cached_p50[size] = [v[key] for v in w if v.get(key) is not None and v.get("from_cache")]
    p(f"| {size} MB, {labels[trig]} | {len(w)} | {hits}/{len(w)} | " + " | ".join(stats(daemon)) + " | "
      + " | ".join(stats(client_ms(g))) + " |")
p("")
para("`cairn resume` returns once the task runs: its daemon figure starts when the wake does",
     "(there is no event), the client's when `cairn resume` starts. The blob-store rows remove",
     "the suspended task's disk image before sending the event, as on a node that did not",
     "suspend it, so that the wake restores every file onto a new disk",
     f"({meta['slow']} wake{'s' if meta['slow'] != 1 else ''} per size).")

# Where a wake's time goes.
p("Where a wake's time goes (medians, ms; the `wake` event's figures and the sandbox start's")
p("from the daemon's debug log, `RUST_LOG=cairn_sandbox=debug`):\n")
p("| wake | accepted → wake starts | disk check / restore | disk attach + mount | cgroups | helper to init ready | total |")
p("|---|---:|---:|---:|---:|---:|---:|")
breakdown = {}
for g in order:
    if "/" not in g or g.split("/")[1] not in ("event", "blob") or not wakes(g):
        continue
    size, trig = g.split("/")
    w = [v for v in wakes(g) if v.get("event_accepted_to_ready_ms") is not None]
    if not w:
        continue
    st = start_of.get(g, [])
    parts = (median(v["event_accepted_to_ready_ms"] - v["sandbox_ready_ms"] for v in w),
             median(v["restored_ms"] for v in w),
             median(s["disk"] for s in st),
             median(s["cgroup"] - s["disk"] for s in st),
             median(s["helper"] - s["cgroup"] for s in st),
             median(v["event_accepted_to_ready_ms"] for v in w))
    breakdown[g] = parts
    p(f"| {size} MB, {labels[trig]} | " + " | ".join("–" if x is None else f"{x:.1f}" for x in parts) + " |")
p("")
ev = breakdown.get("10/event")
if ev and ev[4] is not None:
    versus = f" (a `task create`: {median(create_helper):.0f} ms)" if create_helper else ""
    para(f"Most of a cached wake is the sandbox's helper: {ev[4]:.0f} ms from spawning it to the init",
         f"answering{versus}. A create takes a helper started ahead, already in the cgroups of the",
         "task id it will serve; a wake cannot (its task id is fixed), so it spawns one on the spot,",
         "which joins the task's cgroups itself (cgroup v1 hierarchies on this host, where moving a",
         "process waits for an RCU grace period) and then builds the namespaces and mounts. The rest:",
         f"committing the event and handing the wake to a background job ({ev[0]:.0f} ms); the disk",
         f"check, snapshot lookup and uid slot claim in SQLite ({ev[1]:.0f} ms); attaching and",
         f"mounting the cached disk ({ev[2]:.0f} ms). None of it reads the workspace: the disk is",
         "mounted as the suspend left it.")
    blob = [breakdown.get(s + "/blob") for s in SIZES]
    if all(blob):
        para(f"From the blob store the restore dominates ({blob[0][1]:.0f} ms for 10 MB,",
             f"{blob[1][1]:.0f} ms for 200 MB): every chunk read, decompressed and written onto a new",
             "disk, so that time grows with the workspace.")

# Suspend.
p("Suspend: the daemon's `duration_ms` of the `suspend` event (the snapshot fully stored, the")
p("sandbox torn down, the task `suspended`), and the client's `cairn wait` around it:\n")
p("| suspend | n | p50 | p90 | p99 | max | freeze p50 | `cairn wait` p50 |")
p("|---|---:|---:|---:|---:|---:|---:|---:|")
for size in SIZES:
    s = rows.get((f"{size}/event", "suspend"), [])
    if not s:
        continue
    first, rest = s[0], s[1:]
    waits = [v / 1000 for v in rows.get((f"{size}/event", "wait_us"), [])]
    p(f"| {size} MB, the first (whole workspace new) | 1 | {ms(first['duration_ms'])} | | | | "
      f"{ms(first['freeze_ms'])} | {ms(waits[0]) if waits else '–'} |")
    if rest:
        d = [v["duration_ms"] for v in rest]
        p(f"| {size} MB, then 4 KB changed | {len(rest)} | " + " | ".join(stats(d)) + " | "
          f"{ms(median(v['freeze_ms'] for v in rest))} | {ms(median(waits[1:]))} |")
many_susp = [v / 1000 for v in rows.get(("many", "suspend_us"), [])]
if many_susp:
    p(f"| `cairn suspend`, ten 4 KB files (client) | {len(many_susp)} | " + " | ".join(stats(many_susp)) + " | | |")
p("")
incr = [v for size in SIZES for v in rows.get((f"{size}/event", "suspend"), [])[1:]]
snaps = [v for size in SIZES for v in rows.get((f"{size}/event", "snapshot"), [])[1:]]
if incr and snaps:
    d, sn = median(v["duration_ms"] for v in incr), median(v["duration_ms"] for v in snaps)
    fz = median(v["freeze_ms"] for v in incr)
    para(f"Where an incremental suspend's {d:.0f} ms go (medians, both sizes): the `suspend` snapshot",
         f"{sn:.0f} ms, of which the freeze window {fz:.1f} ms; then tearing the sandbox down (kill,",
         f"unmount, detach the loop device, remove the cgroups) and the state changes, {d - sn:.0f} ms.",
         *(["The freeze is mostly waiting: right after `FROZEN` is written the cgroup v1 freezer",
            "usually still reads `FREEZING`, and the daemon polls it every 10 ms."] if fz >= 9.5 else []))

# 1,000 suspended tasks.
G = "many"
count = one(G, "count", 0)
fp, fp2 = one(G, "footprint", {}), one(G, "footprint_restarted", {})
held = grown = None
if count:
    none_kb, half_kb, all_kb = one(G, "rss_none_kb"), one(G, "rss_half_kb"), one(G, "rss_all_kb")
    half = count // 2
    held = (all_kb - none_kb) / count
    marginal = (all_kb - half_kb) / (count - half)
    before, after = one(G, "rss_before_kb"), one(G, "rss_after_kb")
    grown = (after - before) / one(G, "grown_over")
    ys = rows.get((G, "rss_kb"), [])[half:]
    slope = statistics.linear_regression(range(len(ys)), ys).slope if len(ys) > 2 else None
    creates = [v / 1000 for v in rows.get((G, "create_us"), [])]
    total_s = sum(rows.get((G, "create_suspend_us"), [])) / 1e6

    def states(key):
        return ", ".join(f"{n} {s}" for s, n in sorted(one(G, key, {}).items()))

    para(f"{count:,} suspended tasks at once: each created with `--disk 256M`, given ten 4 KB files",
         f"and suspended with `cairn suspend`, {meta['par']} at a time ({total_s:.0f} s in all, `task create`",
         f"p50 {ms(pct(creates, 50))}), then all destroyed. The daemon's memory for them is measured",
         "on new daemon processes on the same home, restarted with none, half and all of them",
         "suspended and read 3 s after start before any request, so that nothing else differs: not",
         "what the runs above left in its heap, nor what creating them did. That heap is measured",
         "apart: the growth of the running daemon's RSS while it created and suspended the second",
         "half.")
    p("| what | value |")
    p("|---|---:|")
    p(f"| states (after a restart of the daemon) | {states('states')} ({states('states_restarted')}) |")
    p(f"| daemon RSS, restarted with none → half → all of them | {kib(none_kb)} → {kib(half_kb)} → {kib(all_kb)} |")
    p(f"| ... per suspended task (from half to all) | **{held:.1f} KiB** ({marginal:.1f} KiB) |")
    p(f"| running daemon while creating and suspending: RSS | {kib(before)} → {kib(after)} |")
    p(f"| ... per task (least-squares slope) | {grown:.1f} KiB ({'–' if slope is None else f'{slope:.1f} KiB'}) |")
    p(f"| daemon threads, open files | {one(G, 'daemon_threads')}, {one(G, 'daemon_fds')} |")
    p(f"| processes in their cgroups (after the restart) | {fp.get('procs')} ({fp2.get('procs')}) |")
    p(f"| cgroups, mounts, loop devices naming them (after the restart) | {fp.get('cgroups')}, {fp.get('mounts')}, "
      f"{fp.get('loops')} ({fp2.get('cgroups')}, {fp2.get('mounts')}, {fp2.get('loops')}) |")
    p(f"| their disk images (sparse ext4, kept as a cache): used | {kib(one(G, 'disks_after_kb'))}, "
      f"{one(G, 'disks_after_kb') / count:.0f} KiB each |")
    p(f"| ... apparent size | {kib(one(G, 'disks_apparent_kb'))} |")
    p(f"| task database with its WAL | {kib(one(G, 'db_kb'))} |")
    p(f"| blob store (every snapshot of this benchmark) | {kib(one(G, 'blobs_kb'))} |")
    p(f"| destroying them all ({meta['par'] * 4} at a time) | {one(G, 'destroy_total_us') / 1e6:.1f} s |")
    p(f"| their disk images left afterwards | {one(G, 'images_left')} |")
    p("")
    para("A suspended task is rows in SQLite and a disk image file, and no process: a daemon",
         f"started with {count:,} of them takes {held:.1f} KiB more a task than one started with none",
         f"({marginal:.1f} KiB a task from half to all of them), reading the larger database at",
         "start-up included.",
         *([f"The running daemon's {grown:.1f} KiB a task is what creating, snapshotting and tearing",
            "down that many sandboxes left in its heap, not state held for each suspended task."]
           if held < grown / 2 else []))

# Webhooks.
runs = rows.get(("hooks", "run"), [])
if runs:
    logged = one("hooks", "logged", {})
    para("Webhook intake: one task suspended on `--webhook never-sent`; webhooks named `other` to",
         "its URL (accepted and kept in its inbox, none wakes it), each with its own `webhook-id`,",
         "signed in advance with the `standardwebhooks` library and posted from Python over",
         "keep-alive HTTP/1.1 connections. Each accepted one is committed to SQLite before the",
         "answer (`synchronous=FULL`: one fsync'd transaction with the duplicate check, the inbox row",
         "and the log event).")
    p("| clients | sent | accepted | refused | accepted/s | p50 | p90 | p99 | max |")
    p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        ok = r["ok_ms"]
        p(f"| {r['threads']} | {r['n']} | {len(ok)} | {len(r['refused_ms'])} | {len(ok) / r['wall_s']:.0f} | "
          + " | ".join(stats(ok)) + " |")
    p("")
    for r in runs:
        for err, n in r["errors"].items():
            para(f"{r['threads']} client{'s' if r['threads'] != 1 else ''}: {n} refused with `{err}`;", indent="  ")
    if any("database is locked" in e for r in runs for e in r["errors"]):
        para("the refusals are SQLITE_BUSY (code 5) and SQLITE_BUSY_SNAPSHOT (517), answered at once",
             "as 500: a delivery's transaction begins deferred, reads (the duplicate check, the task's",
             "state) and then writes; when another connection of the pool has committed meanwhile, the",
             "snapshot it read cannot become a write transaction, and the busy timeout does not apply.",
             "A sender following Standard Webhooks retries a 5xx later, so nothing is lost, but",
             "concurrent deliveries are mostly refused; a transaction that begins as a writer",
             "(`BEGIN IMMEDIATE`) would queue them instead;", indent="  ")
    accepted = sum(len(r["ok_ms"]) for r in runs)
    para(f"events in the task's log afterwards: {logged.get('events')} of the {accepted} accepted;",
         f"the task stayed `{logged.get('state_after')}`.", indent="  ")
    p("")

# Against the goals.
p("Against the goals:\n")
goals = []
if cached_p50.get("10"):
    a = pct(cached_p50["10"], 50)
    goals.append(f"p50 wake for 10 MB under 50 ms: {a:.1f} ms, **{'met' if a < 50 else 'not met'}**;")
if cached_p50.get("10") and cached_p50.get("200"):
    a, b = pct(cached_p50["10"], 50), pct(cached_p50["200"], 50)
    flat = b - a <= max(5.0, 0.2 * a)
    blob = ", ".join(f"{s} MB {ms(breakdown[s + '/blob'][5])}" for s in SIZES if s + "/blob" in breakdown)
    goals.append(f"on the node that suspended the task, a wake that does not grow with the workspace: p50 {a:.1f} ms "
                 f"for 10 MB, {b:.1f} ms for 200 MB (20× the data), **{'met' if flat else 'not met'}** (taken as: "
                 f"200 MB no more than 5 ms or 20 % slower)" + (f"; from the blob store it does grow ({blob})" if blob else "") + ";")
if count:
    none = all(d.get(k) == 0 for d in (fp, fp2) for k in ("procs", "cgroups", "mounts", "loops"))
    goals.append(f"no process for a suspended task: {fp.get('procs')} processes, {fp.get('cgroups')} cgroups, "
                 f"{fp.get('mounts')} mounts and {fp.get('loops')} loop devices for {count:,} suspended tasks, none "
                 f"after a restart either, **{'met' if none else 'not met'}**;")
    goals.append(f"under 10 KB of daemon memory each: {held:.1f} KiB a task for a daemon holding {count:,}, "
                 f"**{'met' if held < 10 else 'not met'}**; counting instead the running daemon's growth while it "
                 f"created and suspended them, {grown:.1f} KiB a task, **{'met' if grown < 10 else 'not met'}**.")
for g in goals:
    para(g, indent="  ")
p("")

section = "\n".join(out).rstrip("\n") + "\n"
sys.stdout.write(section)

if doc:
    # Read right before writing: others may have changed other sections.
    text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
    m = re.search(r"^## Suspend and wake\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
    if m:
        text = text[:m.start()] + section + ("\n" if m.end() < len(text) else "") + text[m.end():]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(doc, "w").write(text)
    print(f"wrote the Suspend and wake section of {os.path.basename(doc)}", file=sys.stderr)
