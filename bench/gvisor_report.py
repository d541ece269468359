"""Turns bench/gvisor.sh's measurements into the "## gvisor driver: suspend
and wake with memory" section of docs/benchmarks.md.

    gvisor_report.py RESULTS.jsonl ROUNDS [--write-docs DOC]

The section goes to stdout; with --write-docs it also replaces that section
of DOC (or is appended to it), leaving the rest of DOC as it is.
"""
import datetime
import json
import os
import platform
import re
import statistics
import sys

from machine import cpu_model, version

HEADING = "## gvisor driver: suspend and wake with memory"
args = sys.argv[1:]
doc = None
if "--write-docs" in args:
    i = args.index("--write-docs")
    doc = args[i + 1]
    del args[i:i + 2]
results_path, rounds = args[0], args[1]

values = {}
for line in open(results_path):
    r = json.loads(line)
    values.setdefault((r["g"], r["k"]), []).append(r["v"])


def med(group, key):
    xs = values.get((group, key))
    return statistics.median(xs) if xs else None


def ms(x):
    return "–" if x is None else f"{x:,.0f} ms"


def mb(x):
    return "–" if x is None else f"{x / 1e6:,.1f} MB"


def ratio(a, b):
    return "–" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


out = []
p = out.append
p(HEADING + "\n")
p("A gvisor task's suspend checkpoints the sandbox (processes and memory) and stores the image with the")
p("files of the suspend snapshot; its wake restores both, so the service goes on where it was. A native")
p("task's suspend keeps the files only: its wake starts the service again. Each task here runs a service")
p("holding 10 MB or 200 MB of random bytes (nothing for the checkpoint to skip) over the same 8 MB")
p(f"workspace; {rounds} suspend/resume cycles per driver and size, medians, one run of `bench/gvisor.sh`")
p("(`--write-docs` rewrites this section). \"runsc alone\" is `runsc checkpoint` and `runsc restore` of a")
p("plain runsc sandbox holding the same memory (the host's root read-only), the floor under Cairn's figures.\n")
p(f"- date: {datetime.date.today().isoformat()}")
p(f"- machine: {os.cpu_count()} cores, {cpu_model()}, kernel {platform.release()}")
p(f"- runsc: {version(['runsc', '--version'])}, ptrace platform\n")
p("| memory | driver | suspend | of it: checkpoint | stored per suspend | wake (client) | sandbox ready | processes kept |")
p("|---:|---|---:|---:|---:|---:|---:|---|")
for size in (10, 200):
    for driver in ("gvisor", "native"):
        g = f"{driver}-{size}"
        kept = values.get((g, "resumed"), [])
        kept = "yes" if kept and all(v is True for v in kept) else "no"
        p(f"| {size} MB | {driver} | {ms(med(g, 'suspend_ms'))} | {ms(med(g, 'checkpoint_ms')) if driver == 'gvisor' else '–'} "
          f"| {mb(med(g, 'image_bytes')) if driver == 'gvisor' else '–'} | {ms(med(g, 'wake_ms'))} | {ms(med(g, 'ready_ms'))} | {kept} |")
    g = f"runsc-{size}"
    p(f"| {size} MB | runsc alone | – | {ms(med(g, 'checkpoint_ms'))} | {mb(med(g, 'image_bytes'))} | – | restore {ms(med(g, 'restore_ms'))} | yes |")
p("")
for size in (10, 200):
    gv, nat, raw = f"gvisor-{size}", f"native-{size}", f"runsc-{size}"
    p(f"- {size} MB: a gvisor suspend takes {ratio(med(gv, 'suspend_ms'), med(nat, 'suspend_ms'))} the native one, "
      f"a gvisor wake {ratio(med(gv, 'wake_ms'), med(nat, 'wake_ms'))}; Cairn's checkpoint is "
      f"{ratio(med(gv, 'checkpoint_ms'), med(raw, 'checkpoint_ms'))} runsc's alone, its sandbox start on wake "
      f"(restore included) {ratio(med(gv, 'ready_ms'), med(raw, 'restore_ms'))} runsc's restore alone.")
p("")
p("\"stored per suspend\" is the logical size of the suspend snapshot (files and image); the blob store keeps")
p("only the chunks it did not have. The native driver's wake is quicker because it restores no memory, but its")
p("service starts from nothing.")

section = "\n".join(out).rstrip("\n") + "\n"
sys.stdout.write(section)

if doc:
    text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
    m = re.search(r"^" + re.escape(HEADING) + r"\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
    if m:
        text = text[:m.start()] + section + ("\n" if m.end() < len(text) else "") + text[m.end():]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(doc, "w").write(text)
    print(f"wrote the {HEADING[3:]} section of {os.path.basename(doc)}", file=sys.stderr)
