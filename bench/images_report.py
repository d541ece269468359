"""Writes the "## Images" section of docs/benchmarks.md from what
bench/images.sh left in its work directory (hyperfine's JSON exports and
the sizes it measured), replacing the section if it is there.

    images_report.py WORK DOC
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_model, mem_total  # noqa: E402

work, doc = sys.argv[1], sys.argv[2]


def load(name: str):
    with open(os.path.join(work, name)) as f:
        return json.load(f)


def results(name: str) -> dict:
    return {r["command"]: r for r in load(f"{name}.json")["results"]}


def t(sec: float) -> str:
    """A duration, to three significant figures."""
    ms = sec * 1e3
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 1000:
        return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"
    return f"{sec:.2f} s"


def mb(b: float) -> str:
    return f"{b / 1e6:,.1f} MB"


def med(r: dict) -> float:
    return statistics.median(r["times"])


def mean_sd(r: dict) -> str:
    sd = statistics.stdev(r["times"]) if len(r["times"]) > 1 else 0.0
    m = statistics.mean(r["times"])
    if m >= 1:
        return f"{m:.2f} ± {sd:.2f} s"
    return f"{m * 1e3:.1f} ± {sd * 1e3:.1f} ms"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×"


meta = load("meta.json")
small = meta["small"] == 1
pull = results("pull")
served = load("served.json")
disk = load("disk.json")
create = results("create")
csizes = load("create-sizes.json")
forks = {k: results(k) for k in ("fork10-cold", "fork100-cold", "fork10-warm", "fork100-warm")}
fsizes = load("fork-sizes.json")
big, shared, huge = load("big-layout.json"), load("shared-layout.json"), load("huge-layout.json")

out: list[str] = []
p = out.append

p("## Images")
p("")
p("OCI images pulled from a registry and stored as shared layers, templates committed from tasks,")
p("and forks that share their snapshot as a read-only layer. `bench/images.sh` reproduces all of it")
p("in one run and writes this section; the images are OCI layouts it generates with")
p("`bench/oci_layout.py` (gzip layers, fixed seeds, so every run has the same images). One daemon")
p(f"(`--disk-pool {meta['disk_pool']}`) in a new home; each timed line is from `hyperfine`, {meta['runs']} runs after")
p(f"{meta['warmup']} warm-up{'s' if meta['warmup'] != 1 else ''} unless the table says otherwise.")
p("")
if small:
    p(f"**A check run (`SMALL=1`): every size ÷{meta['scale']}, at most 3 runs. These figures show that the")
    p("script works; they are not a measurement. The sizes below are the ones used.**")
    p("")
p(f"- date: {datetime.date.today()}")
p(f"- machine: {os.cpu_count()} cores, {cpu_model()}, {mem_total()}, kernel {platform.release()}")
p(f"- commit: {meta['commit']}; load average before the report: {meta['load']}")
p(f"- peers: {meta['skopeo']}, {meta['umoci']}, {meta['registry']} (the registry); {meta['hyperfine']}")
p("")

# 1. Pull.
bl = big["layers"].values()
raw, gz = sum(l["uncompressed"] for l in bl), sum(l["size"] for l in bl)
c, s = pull["cairn image pull"], pull["skopeo copy + umoci unpack"]
rounds = meta["runs"] + meta["warmup"]
p("**Pull and unpack.** An image of 4 layers, 20 files each half random bytes and half log-like")
p(f"text, and busybox: {mb(raw)} of tar, {mb(gz)} gzipped. It is pushed once with `skopeo` to Debian's")
p("`docker-registry` on 127.0.0.1 (plain HTTP, filesystem storage in the run's directory), then")
p("pulled from it by each tool in turn:")
p("")
p("| what | median | mean ± σ | min | vs cairn |")
p("|---|---:|---:|---:|---:|")
for name, r in (("`cairn image pull --insecure`", c), ("`skopeo copy` + `umoci unpack`", s)):
    p(f"| {name} | {t(med(r))} | {mean_sd(r)} | {t(min(r['times']))} | {ratio(med(r), med(c))} |")
p("")
p("A pull downloads only the layers its layer store lacks, so before each cairn run `cairn image rm`")
p("removes the pulled image (which removes the layers no other image has) and `cairn gc` runs, and")
p("the step fails if any of the four layers is still stored. Every run downloads all four: the")
p(f"registry's access log counts {served['cairn']} layer downloads by cairn and {served['skopeo']} by skopeo, for {rounds} runs")
p(f"of each, warm-ups included ({4 * rounds} if every run took all four). Before each skopeo run its OCI")
p("directory and umoci's bundle are removed. Both prepare steps end with `sync`, so that no run pays")
p("for the previous one's writeback.")
p("")
p("What each line includes:")
p("")
p("- **cairn image pull**: the CLI and one request to the daemon; the manifest and config fetched")
p("  and checked; each layer streamed to a staging file, hashed and counted as it comes, fsync'd;")
p("  then unpacked into the layer store, one layer at a time: every tar entry checked (`..`,")
p("  absolute paths and links out of the tree refused, device nodes left out), the diffid checked,")
p("  the tree synced to disk (`syncfs`) and renamed into place; the image published the same way and")
p("  the downloaded blobs deleted. A task can start on it at once: the layers are its overlay's")
p("  lower directories.")
p("- **skopeo copy + umoci unpack**: two processes; skopeo copies the blobs into an OCI layout,")
p("  checking their digests; umoci unpacks the layers in order into a runtime bundle's `rootfs`,")
p("  applying whiteouts, and writes the bundle's `config.json` and an mtree manifest of the tree.")
p("")

# 2. Disk.
sl = shared["layers"]
base_raw = sl["base"]["uncompressed"]
top_raw = statistics.mean(sl[f"top{i}"]["uncompressed"] for i in range(10))
total = disk["store_bytes"] + disk["image_dir_bytes"]
p(f"**Disk used by 10 images sharing a base layer.** A base layer of {mb(base_raw)} (tar) and ten images")
p(f"on it, each with a top layer of its own of {mb(top_raw)}, all in one OCI layout, imported with")
p("`cairn image import NAME DIR --tag TAG`; next to each image unpacked with `umoci unpack` (its")
p("`rootfs`, summed over the ten). `du -sb` (apparent sizes, each hard-linked file once):")
p("")
p("| what | size | vs cairn in all |")
p("|---|---:|---:|")
p(f"| cairn: the layer store (`$CAIRN_HOME/layers`, {disk['layers_stored']} layers) | {mb(disk['store_bytes'])} | |")
p(f"| cairn: the 10 images' directories (`$CAIRN_HOME/images/NAME`) | {mb(disk['image_dir_bytes'])} | |")
p(f"| **cairn in all** | **{mb(total)}** | 1.00× |")
p(f"| 10 flattened copies (`umoci unpack`, `rootfs`) | {mb(disk['flat_bytes'])} | {ratio(disk['flat_bytes'], total)} |")
p("")
p("The base is stored once and each image adds its own layer and a description; a flattened copy")
p("holds the base again each time.")
p("")

# 3. Create.
hl = huge["layers"]
host = med(create["host"])
p("**Task create + first exec** of `/bin/true`, as in the start-up section (two CLI processes: `task")
p("create`, then `exec`), from four images, side by side; the tasks a run created are destroyed")
p("before the next:")
p("")
p("| image | median | mean ± σ | min | vs host |")
p("|---|---:|---:|---:|---:|")
rows = [
    ("host", "`host`, the default: the host's `/usr` and the rest read-only"),
    ("template", f"a template: a task on `host` that wrote {mb(csizes['prepared_bytes'])} (5 files of random bytes), `image commit`"),
    ("1 GB image", f"an OCI image of {len(huge['images']['v1']['layers'])} layers, {mb(csizes['huge_bytes'])} of files"),
    ("small image", "an OCI image of 1 layer, busybox alone"),
]
for key, label in rows:
    r = create[key]
    p(f"| {label} | {t(med(r))} | {mean_sd(r)} | {t(min(r['times']))} | {ratio(med(r), host)} |")
p("")
p("Every line starts the same sandbox: a pooled disk for the writable layer, an overlay root whose")
p("lower directories are the image's layers (a template: its committed layer over its parent's),")
p("mounted where they are stored; nothing of the image is copied or read, whatever its size. The 1 GB")
p("image's files are zeros with 64 KiB of random bytes in each MiB (quick to generate), all of it")
p("file data in the layers.")
p("")

# 4. Forks.
p(f"**Forks** of a task on `host` that wrote {mb(fsizes['source_bytes'])} in 20 files of random bytes, from its")
p(f"snapshot (`cairn snapshot`: {mb(fsizes['snapshot_bytes'])} of files in its writable layer). The forks share the")
p("snapshot as a hidden template, the *base*, made on first use by restoring the snapshot once into")
p("the layer store and removed with the last fork that uses it. With no fork alive, each run makes it")
p("again (its prepare step checks that it is gone); the *base kept* runs keep one fork alive, so the")
p("base is there already. The CLI returns when every fork is running; each prepare step destroys the")
p("forks of the run before.")
p("")
p("| what | runs | median | mean ± σ | min | per fork |")
p("|---|---:|---:|---:|---:|---:|")
labels = {
    "fork10-cold": ("`fork --count 10`, making the base", "fork --count 10", 10),
    "fork100-cold": ("`fork --count 100`, making the base", "fork --count 100", 100),
    "fork10-warm": ("`fork --count 10`, base kept", "fork --count 10, base kept", 10),
    "fork100-warm": ("`fork --count 100`, base kept", "fork --count 100, base kept", 100),
}
m = {}
for key, (label, cmd, n) in labels.items():
    r = forks[key][cmd]
    m[key] = med(r)
    p(f"| {label} | {len(r['times'])} | {t(m[key])} | {mean_sd(r)} | {t(min(r['times']))} | {t(m[key] / n)} |")
p("")
marg_cold = (m["fork100-cold"] - m["fork10-cold"]) / 90
marg_warm = (m["fork100-warm"] - m["fork10-warm"]) / 90
p(f"From 10 to 100 forks each further fork cost {t(marg_cold)} (making the base) and {t(marg_warm)} (base")
p("kept): a task row with its `branch` snapshot in SQLite, a disk (from the pool while it lasts, here")
p(f"{meta['disk_pool']} ready, else a sparse copy of a blank formatted image) and a sandbox started on the base, 8 at a time. Making")
p("the base is the part that grows with the snapshot: for 10 forks, the difference between the two")
p(f"lines, {t(m['fork10-cold'] - m['fork10-warm'])}.")
p("")

tmpl = med(create["template"])
p("Against the goals:")
p("")
ok = tmpl <= host * 1.10
p(f"- creating from a template as fast as from `host`: {t(tmpl)} against {t(host)}, {ratio(tmpl, host)} —")
p(f"  **{'met' if ok else 'not met'}** (taken as: no more than 10 % slower);")
for key, what in (("fork100-cold", "making the base in the run"), ("fork100-warm", "base kept")):
    p(f"- 100 forks in under a second, {what}: {t(m[key])} — **{'met' if m[key] < 1 else 'not met'}**{';' if key.endswith('cold') else '.'}")
p("")

section = "\n".join(out)
text = open(doc).read()
start = text.find("\n## Images\n")
if start >= 0:
    nxt = text.find("\n## ", start + 1)
    text = text[:start + 1] + section + (text[nxt:] if nxt >= 0 else "\n")
else:
    text = text.rstrip("\n") + "\n\n" + section
open(doc, "w").write(text)
print(section)
