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
