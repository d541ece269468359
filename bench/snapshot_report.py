"""Turns bench/snapshots.sh's measurements into the "## Snapshots" section
of docs/benchmarks.md.

    snapshot_report.py RESULTS.tsv SHAPE.json [--write-docs DOC]

RESULTS.tsv has one measurement a line: round, key, value. The section goes
to stdout; with --write-docs it also replaces the "## Snapshots" section of
DOC (or is appended to it), leaving the rest of DOC as it is.
"""
import datetime
import json
import os
import platform
import re
import statistics
import sys
from collections import defaultdict

from machine import cpu_model, mem_total, version

args = sys.argv[1:]
doc = None
if "--write-docs" in args:
    i = args.index("--write-docs")
    doc = args[i + 1]
    del args[i:i + 2]
results_path, shape_path = args

values = defaultdict(list)
rounds = set()
for line in open(results_path):
    r, key, value = line.rstrip("\n").split("\t")
    rounds.add(r)
    values[key].append(float(value))
shape = json.load(open(shape_path))
n = len(rounds)


def med(key):
    return statistics.median(values[key])


def mb(b):
    return f"{b / 1e6:.1f} MB"


def ms(x):
    return f"{x / 1000:.2f} s" if x >= 1000 else f"{x:.0f} ms" if x >= 100 else f"{x:.1f} ms"





def zstd_version():
    m = re.search(r"v(\d+\.\d+\.\d+)", version(["zstd", "--version"]))
    return f"zstd {m.group(1)}" if m else "zstd (unknown version)"


def restic_version():
    m = re.match(r"(restic \S+)", version(["restic", "version"]))
    return m.group(1) if m else "restic (unknown version)"


# Stored sizes: cairn's are what the blob store grew by; restic's second run
# is what its repository grew by.
restic_second_growth = [b - a for a, b in zip(values["restic_first_stored"], values["restic_second_stored"])]
stored = {
    "cairn_full": mb(med("cairn_full_stored")),
    "cairn_incr": "+" + mb(med("cairn_incr_stored")),
    "restic_first": mb(med("restic_first_stored")),
    "restic_second": "+" + mb(statistics.median(restic_second_growth)),
    "tar_zstd": mb(med("tar_zstd_stored")),
}

full, incr = med("cairn_full_ms"), med("cairn_incr_ms")
rows = [
    # label, key, stored, compared with (key)
    ("cairn snapshot, full", "cairn_full_ms", stored["cairn_full"], None),
    ("restic backup, first run", "restic_first_ms", stored["restic_first"], "cairn_full_ms"),
    ("tar \\| zstd -3 -T0", "tar_zstd_ms", stored["tar_zstd"], "cairn_full_ms"),
    ("cairn snapshot, incremental (10 files changed)", "cairn_incr_ms", stored["cairn_incr"], None),
    ("restic backup, second run (same 10 files changed)", "restic_second_ms", stored["restic_second"], "cairn_incr_ms"),
    ("cairn freeze window, full snapshot", "cairn_full_freeze_ms", "", None),
    ("cairn freeze window, incremental snapshot", "cairn_incr_freeze_ms", "", None),
    ("cairn rollback to the full snapshot", "cairn_rollback_ms", "", None),
]

out = []
p = out.append
p("## Snapshots\n")
p("A snapshot captures a task's writable layer into the content-addressed blob store; a")
p("rollback puts the layer back in place. Measured against `restic backup` of the same")
p("directory and `tar | zstd`, side by side in the same run; `bench/snapshots.sh` reproduces")
p(f"it (`--write-docs` rewrites this section). {n} round{'s' if n != 1 else ''}; every round starts from nothing: a new")
p("daemon home (an empty blob store), a new task (`--disk 4G --memory 1G`) whose workspace is")
p("generated inside its sandbox with a fixed seed, a new restic repository and cache.\n")
p(f"- date: {datetime.date.today().isoformat()}")
p(f"- machine: {os.cpu_count()} cores, {cpu_model()}, {mem_total()}, kernel {platform.release()}")
p(f"- peers: {restic_version()} (repository format 2, compression auto), {zstd_version()}, "
  f"{version(['tar', '--version'])}")
p(f"- workspace: {shape['files']:,} files in {shape['dirs']} directories, {mb(shape['bytes'])}: "
  f"{shape['small']:,} source-like text files of 1–40 KB ({mb(shape['small_bytes'])}), "
  f"{shape['medium']} files of 1–3 MiB ({mb(shape['medium_bytes'])}) and {shape['large']} of 16–24 MiB "
  f"({mb(shape['large_bytes'])}), each of those half random bytes and half log-like records")
p(f"- the change: append ~2 KB to 5 small files, overwrite 5 of the 1–3 MiB files with new random "
  f"data ({mb(med('changed_bytes'))} in the 10 files)\n")
p(f"| what | median | min | max | stored | time ÷ cairn's |")
p("|---|---:|---:|---:|---:|---:|")
for label, key, st, vs in rows:
    v = values[key]
    ratio = f"{med(key) / med(vs):.1f}×" if vs else ""
    p(f"| {label} | {ms(med(key))} | {ms(min(v))} | {ms(max(v))} | {st or ''} | {ratio} |")
p("")
p("Times are the wall clock of the command (for cairn: the CLI, its HTTP round trip and the")
p(f"daemon's work; the daemon's own `duration_ms` had medians of {ms(med('cairn_full_daemon_ms'))} (full),")
p(f"{ms(med('cairn_incr_daemon_ms'))} (incremental) and {ms(med('cairn_rollback_daemon_ms'))} (rollback)). "
  "Stored is what the blob store, the")
p("restic repository or the archive grew by (`du -sb`, MB = 10⁶ bytes). The snapshot holds the")
p(f"whole writable layer, {med('cairn_full_files'):,.0f} files; restic and tar read only `/workspace`'s")
p("directory in the layer, from the host. Nothing else ran in the sandbox meanwhile. The rollback")
p(f"wrote {med('cairn_rollback_files_written'):.0f} files ({mb(med('cairn_rollback_bytes_written'))}) "
  "and kept the rest; it includes stopping the sandbox and starting a fresh")
p("one on the restored layer. Each round checks that the changed files are back as they were.\n")
p("Fairness: the workspace was written just before and the machine has RAM to spare, so every")
p("tool reads the same warm page cache (no cache is dropped); `sync` runs before each timed")
p("step, so no tool pays for another's writeback. Odd rounds run cairn first (full: cairn,")
p("restic, tar; incremental: cairn, restic), even rounds last; the 10-file change is made once")
p("and both cairn's incremental snapshot and restic's second run see it; both re-read only the")
p("files whose stat (size, mtime, ctime, inode) changed since their previous run. All three compress with")
p("zstd (cairn level 3, restic's auto, tar's pipe level 3 on all cores); cairn and restic chunk by")
p("content and deduplicate; restic also encrypts. cairn and restic make their data durable")
p("(fsync) before they return; `tar | zstd` does not.\n")

p("This virtual machine is shared with other work: over four runs of this script when this")
p("section was first written, medians moved by up to half between runs, less within one; the")
p("incremental ratio to restic's second run was 6.7–8.5×, the full one 1.8–2.0×, and the worst")
p("incremental freeze window of a run 42–54 ms. Compare the ratios within one run.\n")

restic_first, restic_second = med("restic_first_ms"), med("restic_second_ms")
freeze_incr = values["cairn_incr_freeze_ms"]


def met(ok):
    return "**met**" if ok else "**not met**"


p("Against the goals:\n")
p(f"- incremental snapshot at least 10× faster than restic's second backup: {ms(incr)} against "
  f"{ms(restic_second)}, {restic_second / incr:.1f}× — {met(restic_second / incr >= 10)};")
p(f"- full snapshot faster than restic's first backup: {ms(full)} against {ms(restic_first)}, "
  f"{restic_first / full:.1f}× — {met(full < restic_first)};")
p(f"- freeze window under 50 ms for the incremental case: median {ms(statistics.median(freeze_incr))}, "
  f"worst {ms(max(freeze_incr))} of {n} — {met(max(freeze_incr) < 50)} (counted as met only if every round is under).")
p("")
p("Where an incremental snapshot's time goes (a `perf` profile of the daemon during one and a")
p("trace of its fsyncs, taken once on this machine; redo them after changing the capture):")
p("about a third of its CPU is the two walks of the layer, an `lstat` of each of the 10,000")
p("entries, ~25 ms each; the second walk runs frozen and is the freeze window, which reaches")
p("50 ms when it shares the two cores with the pack workers or anything else. About a quarter")
p("is the new manifest: all 10,000 entries encoded as JSON (chunk ids as hex) and compressed,")
p("~45 ms, and stored whole (~0.7 MB) on every snapshot however little changed. About a quarter")
p("is reading, chunking, hashing and compressing the 8 MB that changed. Then eleven fsyncs")
p("(packs, index, manifest and their directories), ~25 ms together, the SQLite commit, and the")
p(f"CLI and HTTP around it (wall clock minus `duration_ms`: {ms(incr - med('cairn_incr_daemon_ms'))} here). "
  "restic's second run")
p("walks the same 10,000 entries but writes new trees only for the directories on the changed")
p("files' paths.")

section = "\n".join(out) + "\n"
sys.stdout.write(section)

if doc:
    text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
    m = re.search(r"^## Snapshots\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
    if m:
        text = text[:m.start()] + section + ("\n" if m.end() < len(text) else "") + text[m.end():]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(doc, "w").write(text)
    print(f"wrote the Snapshots section of {os.path.basename(doc)}", file=sys.stderr)
