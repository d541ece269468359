"""The asyncio client, `cairn.AsyncClient`, and the driver that runs the
operations of `_ops` over HTTP. The blocking client (`_sync.py`) is
generated from this file by `scripts/unasync.py`: edit this one, then run
the script."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import httpx

from . import _ops as ops
from ._errors import ProtocolError
from ._models import DirEntry, Delivery, EgressPolicy, Event, ExecResult, ProcessInfo, RollbackNote, Secret, Snapshot, TaskInfo, Wait
from ._transport import Call, Op, SseParser, T, decode, discover, event_result, headers, request_args, timeouts, unreachable


class AsyncTransport:
    def __init__(self, url: str, token: str, timeout: float | None) -> None:
        self.url = url
        self.http = httpx.AsyncClient(base_url=url, headers=headers(token), timeout=timeouts(timeout))

    async def close(self) -> None:
        await self.http.aclose()

    async def send(self, call: Call) -> Any:
        try:
            if call.on_event is None:
                r = await self.http.request(call.method, call.path, **request_args(call))
                return decode(call, r.status_code, r.content)
            async with self.http.stream(call.method, call.path, **request_args(call)) as r:
                if r.status_code >= 400:
                    return decode(call, r.status_code, await r.aread())
                parser, last = SseParser(), []
                async for line in r.aiter_lines():
                    got = parser.feed(line)
                    if got and event_result(call, *got, last):
                        return last[0]
                raise ProtocolError(f"{call.path}: the event stream ended without an exit event")
        except httpx.TransportError as e:
            raise unreachable(self.url, e) from None

    async def run(self, op: Op[T]) -> T:
        try:
            call = next(op)
            while True:
                call = op.send(await self.send(call))
        except StopIteration as done:
            return done.value


class AsyncClient:
    """A connection to a Cairn daemon. With no arguments it finds the daemon
    as the CLI does: `CAIRN_URL` and `CAIRN_TOKEN`, else the `url` and
    `token` files of `$CAIRN_HOME` (or the default home)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, home: str | os.PathLike[str] | None = None, timeout: float | None = None) -> None:
        url, token = discover(url, token, home)
        self._t = AsyncTransport(url, token, timeout)
        self.url = url
        self.tasks = AsyncTasks(self)
        self.secrets = AsyncSecrets(self)

    async def close(self) -> None:
        await self._t.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def health(self) -> dict[str, Any]:
        return await self._t.send(ops.Call("GET", "/v1/health"))


class AsyncTasks:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, image: str | None = None, name: str | None = None, **options: Any) -> AsyncTask:
        """A new task (its sandbox starts at once). Options: memory, cpus,
        pids, disk, env (dict), workdir, allow, deny, services, risky,
        idle_suspend, keep_last, expire_after."""
        return AsyncTask(self._c, await self._c._t.run(ops.create_task(image, name, **options)))

    async def get(self, id_or_name: str) -> AsyncTask:
        return AsyncTask(self._c, await self._c._t.run(ops.get_task(id_or_name)))

    async def list(self) -> list[AsyncTask]:
        return [AsyncTask(self._c, t) for t in await self._c._t.run(ops.list_tasks())]


class AsyncSecrets:
    """Credentials the egress proxy injects into a task's requests: set
    and listed here, never read back."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def set(self, name: str, value: str | bytes) -> Secret:
        return await self._c._t.run(ops.set_secret(name, value))

    async def list(self) -> list[Secret]:
        return await self._c._t.run(ops.list_secrets())

    async def remove(self, name: str) -> None:
        await self._c._t.run(ops.remove_secret(name))


class AsyncFiles:
    """The files of a task's sandbox, by sandbox path."""

    def __init__(self, task: AsyncTask) -> None:
        self._task = task

    async def read(self, path: str) -> bytes:
        return await self._task._run(ops.read_file(self._task.id, path))

    async def write(self, path: str, data: bytes | str) -> None:
        await self._task._run(ops.write_file(self._task.id, path, data))

    async def list(self, path: str) -> list[DirEntry]:
        return await self._task._run(ops.list_files(self._task.id, path))


class AsyncTask:
    """One task. `info` is what the daemon said of it last; `refresh()` asks
    again."""

    def __init__(self, client: AsyncClient, info: TaskInfo) -> None:
        self._c = client
        self.id = info.id
        self.info = info
        self.files = AsyncFiles(self)

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.info.state}>"

    async def _run(self, op: ops.Op[Any]) -> Any:
        return await self._c._t.run(op)

    def _update(self, info: TaskInfo) -> AsyncTask:
        self.info = info
        return self

    @property
    def state(self) -> str:
        return self.info.state

    async def refresh(self) -> AsyncTask:
        return self._update(await self._run(ops.get_task(self.id)))

    async def exec(
        self,
        cmd: str | list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
    ) -> ExecResult:
        """Runs `cmd` (an argv list, or a string for `sh -c`) to its end. With
        `on_stdout`/`on_stderr`, output is streamed to them as it comes."""
        return await self._run(ops.exec_(self.id, cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr))

    async def start(
        self,
        cmd: str | list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        user: str | None = None,
        tag: str | None = None,
    ) -> AsyncProcess:
        """Starts `cmd` in the background and returns its handle at once: a
        client that goes away leaves it running. `pty=(rows, cols)` gives it
        a terminal; `stdin=True` keeps its stdin open for `write_stdin`."""
        info = await self._run(ops.start_process(self.id, cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin, pty=pty, user=user, tag=tag))
        return AsyncProcess(self, info)

    async def processes(self) -> list[ProcessInfo]:
        """The task's background commands, running or ended in the last ten minutes."""
        return await self._run(ops.list_processes(self.id))

    async def process(self, pid: int) -> AsyncProcess:
        return AsyncProcess(self, await self._run(ops.get_process(self.id, pid)))

    async def url(self, port: int, *, ttl: str | None = None) -> str:
        """A signed link to a server listening on `port` inside the task,
        through the daemon (valid for `ttl`, default 1h)."""
        return await self._run(ops.port_url(self.id, port, ttl))

    async def snapshot(self, kind: str = "manual", note: str | None = None, *, healthy: bool | None = None, with_memory: bool = False) -> Snapshot:
        """kind: `milestone`, `pre-risk`, `branch` or `manual`. `with_memory`
        (gvisor tasks): also checkpoint the sandbox's processes and memory."""
        return await self._run(ops.snapshot(self.id, kind, note, healthy, with_memory))

    async def snapshots(self) -> list[Snapshot]:
        return await self._run(ops.snapshots(self.id))

    async def rollback(self, to: str | None = None, *, last_healthy: bool = False, reason: str) -> RollbackNote:
        """Rolls the task back in place; the note (with `reason`) stays on the
        task for the agent to read."""
        return await self._run(ops.rollback(self.id, to, last_healthy, reason))

    async def fork(self, from_: str | None = None, count: int = 1) -> list[AsyncTask]:
        return [AsyncTask(self._c, t) for t in await self._run(ops.fork(self.id, from_, count))]

    async def wait_for_approval(self, prompt: str, *, timeout: float | None = None, on_wait: Callable[[Wait], None] | None = None) -> Event:
        """Suspends the task until a person approves or rejects at the wait's
        `approval_url` (given to `on_wait`); answers the approval event
        (`event.data["decision"]` is `approve` or `reject`) once the task runs again."""
        return await self._run(ops.wait_for(self.id, {"approval": prompt}, timeout, on_wait))

    async def wait_for_webhook(self, name: str, *, timeout: float | None = None, on_wait: Callable[[Wait], None] | None = None) -> Event:
        return await self._run(ops.wait_for(self.id, {"webhook": name}, timeout, on_wait))

    async def wait_for_timer(self, seconds: float, *, timeout: float | None = None, on_wait: Callable[[Wait], None] | None = None) -> Event:
        return await self._run(ops.wait_for(self.id, {"timer": f"{int(seconds * 1000)}ms"}, timeout, on_wait))

    async def cancel_wait(self) -> Wait:
        """Cancels the task's pending wait (a task suspended for it wakes);
        a blocking wait on it raises. `NotFound` when none is pending."""
        return await self._run(ops.cancel_wait(self.id))

    async def approve(self, approve: bool = True, comment: str | None = None) -> Any:
        return await self._run(ops.approve(self.id, approve, comment))

    async def send_event(self, name: str, data: Any = None) -> Any:
        return await self._run(ops.send_event(self.id, name, data))

    async def suspend(self) -> AsyncTask:
        return self._update(await self._run(ops.state_change(self.id, "suspend")))

    async def resume(self) -> AsyncTask:
        return self._update(await self._run(ops.state_change(self.id, "resume")))

    async def allow(self, *rules: str) -> EgressPolicy:
        return await self._run(ops.egress(self.id, allow=rules))

    async def deny(self, *rules: str) -> EgressPolicy:
        return await self._run(ops.egress(self.id, deny=rules))

    async def deliver(
        self,
        files: Iterable[str] = (),
        *,
        archive: str | None = None,
        patch: bool = False,
        report: str | None = None,
        complete: bool = False,
        out: str | os.PathLike[str] | None = None,
    ) -> Delivery:
        """Stores the deliverables with a signed record; with `out`, also
        writes them and `record.json` there (for `cairn.verify`)."""
        return await self._run(ops.deliver(self.id, files, archive, patch, report, complete, out))

    async def destroy(self) -> AsyncTask:
        return self._update(await self._run(ops.destroy(self.id)))


class AsyncProcess:
    """A background command's handle (`Task.start`)."""

    def __init__(self, task: AsyncTask, info: ProcessInfo) -> None:
        self._task = task
        self.id = info.id
        self.info = info

    def __repr__(self) -> str:
        return f"<Process {self.id} of {self._task.id} {'running' if self.info.running else 'ended'}>"

    async def output(self) -> ProcessInfo:
        """How it stands, with its output so far."""
        self.info = await self._task._run(ops.get_process(self._task.id, self.id))
        return self.info

    async def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Waits for its end (at most `timeout` seconds) and returns it."""
        self.info = await self._task._run(ops.get_process(self._task.id, self.id, wait=timeout if timeout is not None else 1e9))
        return self.info

    async def write_stdin(self, data: bytes | str, *, close: bool = False) -> None:
        self.info = await self._task._run(ops.process_stdin(self._task.id, self.id, data, close))

    async def close_stdin(self) -> None:
        self.info = await self._task._run(ops.process_stdin(self._task.id, self.id, b"", True))

    async def resize(self, rows: int, cols: int) -> None:
        self.info = await self._task._run(ops.resize_process(self._task.id, self.id, rows, cols))

    async def kill(self) -> ProcessInfo:
        """Kills it and everything it started; answers its end."""
        self.info = await self._task._run(ops.kill_process(self._task.id, self.id))
        return self.info
