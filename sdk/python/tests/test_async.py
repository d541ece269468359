"""The asyncio client: the same calls, awaited, and several at once."""

from __future__ import annotations

import asyncio

import pytest

import cairn


def test_the_async_client_runs_a_task_through_its_arc(daemon, tmp_path):
    async def main() -> None:
        async with cairn.AsyncClient(*daemon) as c:
            t = await c.tasks.create()
            try:
                chunks: list[str] = []
                r = await t.exec("echo a; sleep 0.2; echo b", on_stdout=chunks.append)
                assert r.stdout == "a\nb\n" and "".join(chunks) == r.stdout
                # Several commands at once on one task.
                rs = await asyncio.gather(*(t.exec(["sh", "-c", f"echo {i}"]) for i in range(5)))
                assert [x.stdout for x in rs] == [f"{i}\n" for i in range(5)]
                await t.files.write("/workspace/a.txt", "async")
                assert await t.files.read("/workspace/a.txt") == b"async"
                assert [e.name for e in await t.files.list("/workspace")] == ["a.txt"]
                snap = await t.snapshot(kind="milestone", note="a written")
                await t.files.write("/workspace/a.txt", "broken")
                note = await t.rollback(to=snap.id, reason="async rollback")
                assert note.reason == "async rollback" and await t.files.read("/workspace/a.txt") == b"async"
                assert (await t.wait_for_timer(0.2, timeout=30)).source == "timer"
                d = await t.deliver(["/workspace/a.txt"], out=tmp_path / "out")
                assert cairn.verify(d.record_path)
                with pytest.raises(cairn.NotFound):
                    await c.tasks.get("t0000000000x")
            finally:
                await t.destroy()
            assert t.state == "destroyed"

    asyncio.run(main())


def test_the_async_client_starts_and_waits_for_background_commands(daemon):
    async def main() -> None:
        async with cairn.AsyncClient(*daemon) as c:
            t = await c.tasks.create()
            try:
                ps = await asyncio.gather(*(t.start(["sh", "-c", f"sleep 0.{i}; echo {i}"]) for i in range(1, 4)))
                done = await asyncio.gather(*(p.wait(timeout=30) for p in ps))
                assert [d.stdout for d in done] == ["1\n", "2\n", "3\n"] and all(d.exit_code == 0 for d in done)
                cat = await t.start(["cat"], stdin=True)
                await cat.write_stdin("async stdin", close=True)
                assert (await cat.wait(timeout=30)).stdout == "async stdin"
                long = await t.start(["sleep", "60"])
                assert (await long.kill()).signal == 9
                assert "/ports/9000/" in await t.url(9000)
            finally:
                await t.destroy()

    asyncio.run(main())


def test_the_async_client_sets_lists_and_removes_secrets(daemon):
    async def main() -> None:
        async with cairn.AsyncClient(*daemon) as c:
            made = await c.secrets.set("SDK_ASYNC_TOKEN", "async-secret-value")
            assert made.name == "SDK_ASYNC_TOKEN"
            assert "SDK_ASYNC_TOKEN" in [s.name for s in await c.secrets.list()]
            await c.secrets.remove("SDK_ASYNC_TOKEN")
            assert "SDK_ASYNC_TOKEN" not in [s.name for s in await c.secrets.list()]

    asyncio.run(main())
