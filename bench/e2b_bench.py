"""One side of bench/e2b.sh, in one long-lived Python process.

    e2b_bench.py e2b N     E2B's SDK (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY)
    e2b_bench.py cairn N   Cairn's SDK (CAIRN_URL, CAIRN_TOKEN)

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


if __name__ == "__main__":
    which, n = sys.argv[1], int(sys.argv[2])
    print(json.dumps(with_e2b(n) if which == "e2b" else with_cairn(n)))
