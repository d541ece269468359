"""One side of bench/e2b.sh, in one long-lived Python process.

    e2b_bench.py e2b N     E2B's SDK (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY)
    e2b_bench.py cairn N   Cairn's SDK (CAIRN_URL, CAIRN_TOKEN)
    e2b_bench.py port N    a port's HTTP round trip: through the daemon, and inside the task

Each measures, on the node's default image: create + first command, N warm
command round trips (`bash -l -c true`, what E2B's `commands.run` runs),
and N/10 writes and reads of 10 MB; prints the medians (ms) as JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

DATA = os.urandom(10 << 20)
CMD = ["/bin/bash", "-l", "-c", "true"]


def ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 2)


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def with_e2b(n: int) -> dict:
    from e2b import Sandbox

    creates = []
    for _ in range(max(3, n // 10)):
        holder = {}

        def create_and_run() -> None:
            holder["sb"] = Sandbox.create(timeout=600)
            holder["sb"].commands.run("true")

        creates.append(timed(create_and_run))
        holder["sb"].kill()
    sb = Sandbox.create(timeout=600)
    try:
        for _ in range(10):
            sb.commands.run("true")
        runs = [timed(lambda: sb.commands.run("true")) for _ in range(n)]
        writes, reads = [], []
        for _ in range(max(3, n // 10)):
            writes.append(timed(lambda: sb.files.write("/workspace/ten.bin", DATA)))
            reads.append(timed(lambda: sb.files.read("/workspace/ten.bin", format="bytes")))
        assert sb.files.read("/workspace/ten.bin", format="bytes") == DATA
    finally:
        sb.kill()
    return {"create_first": ms(creates), "run": ms(runs), "write_10mb": ms(writes), "read_10mb": ms(reads), "n": n}


def with_cairn(n: int) -> dict:
    import cairn

    with cairn.Client() as c:
        creates = []
        for _ in range(max(3, n // 10)):
            holder = {}

            def create_and_run() -> None:
                holder["t"] = c.tasks.create()
                holder["t"].exec(CMD)

            creates.append(timed(create_and_run))
            holder["t"].destroy()
        t = c.tasks.create()
        try:
            for _ in range(10):
                t.exec(CMD)
            runs = [timed(lambda: t.exec(CMD)) for _ in range(n)]
            writes, reads = [], []
            for _ in range(max(3, n // 10)):
                writes.append(timed(lambda: t.files.write("/workspace/ten.bin", DATA)))
                reads.append(timed(lambda: t.files.read("/workspace/ten.bin")))
            assert t.files.read("/workspace/ten.bin") == DATA
        finally:
            t.destroy()
    return {"create_first": ms(creates), "run": ms(runs), "write_10mb": ms(writes), "read_10mb": ms(reads), "n": n}


INSIDE = """
import statistics, sys, time, urllib.request
n = int(sys.argv[1])
for _ in range(10):
    urllib.request.urlopen("http://127.0.0.1:8000/").read()
xs = []
for _ in range(n):
    t0 = time.perf_counter()
    urllib.request.urlopen("http://127.0.0.1:8000/").read()
    xs.append(time.perf_counter() - t0)
print(round(statistics.median(xs) * 1e3, 3))
"""


def port_round_trip(n: int) -> dict:
    """A GET of a small page from a server in a task: through the daemon
    (its port route, a kept-alive client) and inside the task itself; on
    the driver `ISOLATION` names (the daemon's default without it)."""
    import cairn
    import httpx

    options = {"isolation": os.environ["ISOLATION"]} if os.environ.get("ISOLATION") else {}
    with cairn.Client() as c:
        t = c.tasks.create(**options)
        try:
            t.exec(["sh", "-c", "mkdir -p /workspace/www && echo ok > /workspace/www/index.html && cd /workspace/www && setsid python3 -m http.server 8000 >/dev/null 2>&1 < /dev/null &"])
            url = f"{os.environ['CAIRN_URL']}/v1/tasks/{t.id}/ports/8000/"
            with httpx.Client(headers={"Authorization": f"Bearer {os.environ['CAIRN_TOKEN']}"}) as h:
                for _ in range(100):
                    if h.get(url).status_code == 200:
                        break
                    time.sleep(0.1)
                for _ in range(10):
                    h.get(url)
                through = [timed(lambda: h.get(url).raise_for_status()) for _ in range(n)]
            t.files.write("/workspace/inside.py", INSIDE)
            inside = float(t.exec(["python3", "/workspace/inside.py", str(n)]).stdout.strip())
        finally:
            t.destroy()
    return {"through_daemon": ms(through), "inside": inside, "n": n}


if __name__ == "__main__":
    which, n = sys.argv[1], int(sys.argv[2])
    print(json.dumps({"e2b": with_e2b, "cairn": with_cairn, "port": port_round_trip}[which](n)))
