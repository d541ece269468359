"""The Python side of bench/table.sh: Cairn's numbers in the format the open
sandbox runtimes publish theirs (create at concurrency 20, create from a
snapshot, suspend and wake, 100 forks, rollback in place, snapshot time
against the size of the change, density), for one isolation.

    table.py ISOLATION IMAGE DAEMON_PID DENSITY OUT.json

Every task it makes is destroyed before it returns (or on an error).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import statistics
import sys
import time

import cairn

isolation, image, daemon_pid, density, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
made: list[str] = []
client = cairn.Client()


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {
        "n": len(xs),
        "avg": round(statistics.fmean(xs), 2),
        "p50": round(statistics.median(xs), 2),
        "p95": round(xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))], 2),
        "min": round(xs[0], 2),
        "max": round(xs[-1], 2),
    }


def create(disk: str = "64M") -> tuple[str, float]:
    # Small disks: the daemon promises each task its disk's size, and a
    # thousand 2 GiB disks would not fit this machine's free space.
    t0 = time.perf_counter()
    t = client.tasks.create(image=image, isolation=isolation, disk=disk)
    took = ms(t0)
    made.append(t.id)
    return t.id, took


def destroy_all(ids: list[str]) -> None:
    with cf.ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda i: client.tasks.get(i).destroy(), ids))
    for i in ids:
        if i in made:
            made.remove(i)


def creates_at(concurrency: int, n: int, disk: str = "64M") -> tuple[dict, float, list[str]]:
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda _: create(disk), range(n)))
    wall = time.perf_counter() - t0
    return summary([d[1] for d in done]), round(n / wall, 1), [d[0] for d in done]


def vm_rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def mem_available_kib() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


def cgroup_kib(task_id: str) -> int | None:
    """What the task's memory cgroup holds (its processes and the page cache
    they made), or None if the host has no such group."""
    for path in (f"/sys/fs/cgroup/memory/cairn/{task_id}/memory.usage_in_bytes", f"/sys/fs/cgroup/cairn/{task_id}/memory.current"):
        try:
            return int(open(path).read()) // 1024
        except OSError:
            continue
    return None


def exec_p50(task, n: int = 50) -> float:
    for _ in range(5):
        task.exec(["/bin/true"])
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        assert task.exec(["/bin/true"]).ok
        xs.append(ms(t0))
    return round(statistics.median(xs), 2)


def timed(f, n: int = 5) -> dict:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        xs.append(ms(t0))
    return summary(xs)


result: dict = {"isolation": isolation}
try:
    # Create at concurrency 20 (and one at a time, for reference).
    stats, rate, ids = creates_at(20, 100)
    result["create_c20"] = stats
    result["create_c20_per_s"] = rate
    destroy_all(ids)
    stats, rate, ids = creates_at(1, 20)
    result["create_c1"] = stats
    destroy_all(ids)

    # One working task: snapshot time against the size of the change.
    tid, _ = create(disk="1G")
    task = client.tasks.get(tid)
    task.exec(["sh", "-c", "mkdir -p /workspace/src && for i in $(seq 200); do echo line $i > /workspace/src/f$i; done"])
    task.snapshot("milestone", "base")
    sizes = {}
    for mb in (1, 10, 100):
        xs, freeze = [], []
        for r in range(3):
            task.exec(["sh", "-c", f"dd if=/dev/urandom of=/workspace/blob{mb}-{r} bs=1M count={mb} 2>/dev/null"])
            t0 = time.perf_counter()
            s = task.snapshot("manual", f"+{mb} MB")
            xs.append(ms(t0))
            freeze.append(s.raw.get("freeze_ms", 0.0))
        sizes[str(mb)] = {"wall": summary(xs), "freeze_p50": round(statistics.median(freeze), 3)}
    result["snapshot_by_change_mb"] = sizes

    # Rollback in place of a 10-file change.
    target = task.snapshot("milestone", "before the change")

    def change_and_roll_back() -> None:
        task.exec(["sh", "-c", "for i in $(seq 10); do echo changed >> /workspace/src/f$i; done"])

    xs = []
    for _ in range(5):
        change_and_roll_back()
        t0 = time.perf_counter()
        task.rollback(target.id, reason="benchmark")
        xs.append(ms(t0))
    result["rollback_10_files"] = summary(xs)

    # Suspend (to the blob store, compute released) and wake (resume: a
    # fresh sandbox restored from the suspend snapshot), then the first exec.
    sus, wake, first = [], [], []
    for _ in range(5):
        t0 = time.perf_counter()
        task.suspend()
        sus.append(ms(t0))
        t0 = time.perf_counter()
        task.resume()
        wake.append(ms(t0))
        t0 = time.perf_counter()
        assert task.exec(["/bin/true"]).ok
        first.append(ms(t0))
    result["suspend"] = summary(sus)
    result["wake"] = summary(wake)
    result["wake_first_exec"] = summary(first)

    # 100 forks of a snapshot whose fork base does not exist yet, then 100
    # more of the same snapshot (its base there), then one.
    # (A task with a small disk: each fork is promised its parent's disk size.)
    fid, _ = create()
    parent = client.tasks.get(fid)
    parent.exec(["sh", "-c", "mkdir -p /workspace/src && for i in $(seq 200); do echo line $i > /workspace/src/f$i; done"])
    snap = parent.snapshot("milestone", "fork point")
    task_for_forks = parent
    t0 = time.perf_counter()
    forks = task_for_forks.fork(snap.id, count=100)
    result["fork100_new_base_ms"] = round(ms(t0), 1)
    made.extend(f.id for f in forks)
    destroy_all([f.id for f in forks])
    t0 = time.perf_counter()
    forks = task_for_forks.fork(snap.id, count=100)
    result["fork100_base_there_ms"] = round(ms(t0), 1)
    made.extend(f.id for f in forks)
    destroy_all([f.id for f in forks])

    def one_fork() -> None:
        f = task_for_forks.fork(snap.id, count=1)
        made.extend(x.id for x in f)

    result["create_from_snapshot"] = timed(one_fork)
    destroy_all([i for i in made if i != tid])

    # Density: DENSITY idle tasks beside the working one.
    result["exec_p50_at_1"] = exec_p50(task)
    rss0, avail0 = vm_rss_kib(daemon_pid), mem_available_kib()
    stats, rate, ids = creates_at(20, density)
    result["density"] = density
    result["density_create_c20"] = stats
    result["density_create_per_s"] = rate
    time.sleep(2)
    rss1, avail1 = vm_rss_kib(daemon_pid), mem_available_kib()
    result["exec_p50_at_density"] = exec_p50(task)
    result["daemon_kib_per_idle_task"] = round((rss1 - rss0) / density, 1)
    result["host_kib_per_idle_sandbox"] = round((avail0 - avail1) / density, 1)
    groups = [k for k in (cgroup_kib(i) for i in ids) if k is not None]
    if groups:
        result["cgroup_kib_per_idle_sandbox"] = round(statistics.fmean(groups), 1)
    destroy_all(ids)
finally:
    for i in list(made):
        try:
            client.tasks.get(i).destroy()
        except Exception as e:  # noqa: BLE001 - clean up what can be
            print(f"cannot destroy {i}: {e}", file=sys.stderr)
    json.dump(result, open(out, "w"), indent=1)
