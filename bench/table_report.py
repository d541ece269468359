"""Writes the "## Cairn in the format of the published tables" section of
docs/benchmarks.md from bench/table.py's results (one JSON file per
isolation): table_report.py DOC RESULT.json..."""

import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from machine import cpu_model, mem_total  # noqa: E402
from section import write_section  # noqa: E402

doc, files = sys.argv[1], sys.argv[2:]
runs = [json.load(open(f)) for f in files]
runs.sort(key=lambda r: r["isolation"] != "native")


def cell(r, f):
    try:
        return f(r)
    except (KeyError, TypeError, ZeroDivisionError):
        return "—"


def ms(v):
    return f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


rows = [
    ("create, avg / p95 (20 concurrent clients)", lambda r: f"{ms(r['create_c20']['avg'])} / {ms(r['create_c20']['p95'])}", "47.8 ms avg"),
    ("creates a second (20 concurrent clients)", lambda r: f"{r['create_c20_per_s']}", ""),
    ("create, one client, p50", lambda r: ms(r["create_c1"]["p50"]), ""),
    ("create from a snapshot (a fork of one), p50", lambda r: ms(r["create_from_snapshot"]["p50"]), ""),
    ("suspend (to the blob store, compute released), p50", lambda r: ms(r["suspend"]["p50"]), ""),
    ("wake (a fresh sandbox restored), p50", lambda r: ms(r["wake"]["p50"]), "42 ms resume"),
    ("first exec after the wake, p50", lambda r: ms(r["wake_first_exec"]["p50"]), ""),
    ("100 forks, fork base made first", lambda r: ms(r["fork100_new_base_ms"]), "100 clones 541 ms; forkd 100 forks 101 ms"),
    ("100 forks, fork base there", lambda r: ms(r["fork100_base_there_ms"]), ""),
    ("rollback in place of a 10-file change, p50", lambda r: ms(r["rollback_10_files"]["p50"]), "82 ms"),
    ("snapshot, 1 MB changed, p50 (freeze)", lambda r: f"{ms(r['snapshot_by_change_mb']['1']['wall']['p50'])} ({r['snapshot_by_change_mb']['1']['freeze_p50']:.2f} ms)", "~46 ms"),
    ("snapshot, 10 MB changed, p50 (freeze)", lambda r: f"{ms(r['snapshot_by_change_mb']['10']['wall']['p50'])} ({r['snapshot_by_change_mb']['10']['freeze_p50']:.2f} ms)", ""),
    ("snapshot, 100 MB changed, p50 (freeze)", lambda r: f"{ms(r['snapshot_by_change_mb']['100']['wall']['p50'])} ({r['snapshot_by_change_mb']['100']['freeze_p50']:.2f} ms)", "~86 ms"),
    ("idle sandboxes held (beside one working task)", lambda r: f"{r['density']:,}", "1,000 on one host"),
    ("create at that density, avg / p95 (20 clients)", lambda r: f"{ms(r['density_create_c20']['avg'])} / {ms(r['density_create_c20']['p95'])}", ""),
    ("exec p50 with 1 task / with all of them", lambda r: f"{ms(r['exec_p50_at_1'])} / {ms(r['exec_p50_at_density'])} ({r['exec_p50_at_density'] / r['exec_p50_at_1']:.2f}×)", ""),
    ("daemon memory per idle task", lambda r: f"{r['daemon_kib_per_idle_task']:.1f} KiB", ""),
    ("memory per idle sandbox: its cgroup / the host's MemAvailable fall", lambda r: f"{r['cgroup_kib_per_idle_sandbox'] / 1024:.2f} MiB / {r['host_kib_per_idle_sandbox'] / 1024:.2f} MiB", ""),
]
isos = [r["isolation"] for r in runs]
lines = [
    "## Cairn in the format of the published tables",
    "",
    "The open sandbox runtimes publish their numbers in one format; these are Cairn's in it,",
    "measured by `bench/table.sh` (one daemon, the Python SDK in one process, a busybox image).",
    "The last column quotes what CubeSandbox and forkd publish for their own hardware: it is",
    "not a side-by-side measurement, only the format and the scale to compare with.",
    "",
    f"- date: {datetime.date.today()}",
    f"- machine: {os.cpu_count()} cores, {cpu_model()}, {mem_total()}, kernel {os.uname().release}",
    "",
    "| what | " + " | ".join(isos) + " | published (theirs) |",
    "|---|" + "---:|" * len(isos) + "---|",
]
for title, f, theirs in rows:
    lines.append(f"| {title} | " + " | ".join(cell(r, f) for r in runs) + f" | {theirs} |")
lines += [
    "",
    "What each line is: a create returns when the task's sandbox runs (disk attached and",
    "mounted, cgroups, namespaces, init ready) and its row is durable; a suspend snapshots the",
    "writable layer (and on gvisor the memory) into the blob store and tears the sandbox down;",
    "a wake makes a fresh sandbox restored from that snapshot; a fork is a new task on the",
    "snapshot's shared fork base; a rollback restores the layer in place and starts a fresh",
    "sandbox on it; a snapshot's time is the client's, its freeze the daemon's. Daemon memory is",
    "the growth of its resident set over the idle tasks; a sandbox's memory is what its memory",
    "cgroup holds (its processes and the page cache they made), averaged, next to the fall of the",
    "host's `MemAvailable` divided by their count (which also moves with the host's page cache, so",
    "it is noisy at small counts).",
    "",
    "Raw results:",
    "",
    "```json",
]
lines += [json.dumps(r, separators=(",", ":")) for r in runs]
lines += ["```", ""]
section = "\n".join(lines)
print(section)
write_section(doc, section)
