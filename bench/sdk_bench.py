"""The Python SDK's side of bench/sdk.sh.

    sdk_bench.py exec TASK              one exec of /bin/true (a new process per call)
    sdk_bench.py create IMAGE CREATED   create + first exec; appends the id to CREATED
    sdk_bench.py inproc TASK IMAGE N    in one process: N warm execs, N/10 create +
                                        first exec; prints medians as JSON
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import cairn


def main() -> None:
    what = sys.argv[1]
    with cairn.Client() as c:
        if what == "exec":
            assert c.tasks.get(sys.argv[2]).exec(["/bin/true"]).ok
        elif what == "create":
            t = c.tasks.create(image=sys.argv[2])
            with open(sys.argv[3], "a") as f:
                f.write(t.id + "\n")
            assert t.exec(["/bin/true"]).ok
        elif what == "inproc":
            task, image, n = c.tasks.get(sys.argv[2]), sys.argv[3], int(sys.argv[4])
            for _ in range(10):
                task.exec(["/bin/true"])
            execs = []
            for _ in range(n):
                t0 = time.perf_counter()
                task.exec(["/bin/true"])
                execs.append(time.perf_counter() - t0)
            creates = []
            for _ in range(max(3, n // 10)):
                t0 = time.perf_counter()
                t = c.tasks.create(image=image)
                t.exec(["/bin/true"])
                creates.append(time.perf_counter() - t0)
                t.destroy()

            async def async_execs() -> list[float]:
                out = []
                async with cairn.AsyncClient() as ac:
                    at = await ac.tasks.get(task.id)
                    for _ in range(10):
                        await at.exec(["/bin/true"])
                    for _ in range(n):
                        t0 = time.perf_counter()
                        await at.exec(["/bin/true"])
                        out.append(time.perf_counter() - t0)
                return out

            aexecs = asyncio.run(async_execs())
            ms = lambda xs: round(statistics.median(xs) * 1e3, 2)  # noqa: E731
            print(json.dumps({"exec": ms(execs), "exec_async": ms(aexecs), "create_exec": ms(creates), "n": n, "creates": len(creates)}))
        else:
            sys.exit(f"unknown mode {what}")


if __name__ == "__main__":
    main()
