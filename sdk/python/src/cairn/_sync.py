"""The blocking client: `cairn.Client`."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

from . import _ops as ops
from ._models import DirEntry, Delivery, EgressPolicy, Event, ExecResult, ProcessInfo, RollbackNote, Secret, Snapshot, TaskInfo, Wait
from ._transport import SyncTransport, discover


class Client:
    """A connection to a Cairn daemon. With no arguments it finds the daemon
    as the CLI does: `CAIRN_URL` and `CAIRN_TOKEN`, else the `url` and
    `token` files of `$CAIRN_HOME` (or the default home)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, home: str | os.PathLike[str] | None = None, timeout: float | None = None) -> None:
        url, token = discover(url, token, home)
        self._t = SyncTransport(url, token, timeout)
        self.url = url
        self.tasks = Tasks(self)
        self.secrets = Secrets(self)

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        return self._t.send(ops.Call("GET", "/v1/health"))


class Tasks:
    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, image: str | None = None, name: str | None = None, **options: Any) -> Task:
        """A new task (its sandbox starts at once). Options: memory, cpus,
        pids, disk, env (dict), workdir, allow, deny, services, risky,
        idle_suspend, keep_last, expire_after."""
        return Task(self._c, self._c._t.run(ops.create_task(image, name, **options)))

    def get(self, id_or_name: str) -> Task:
        return Task(self._c, self._c._t.run(ops.get_task(id_or_name)))

    def list(self) -> list[Task]:
        return [Task(self._c, t) for t in self._c._t.run(ops.list_tasks())]


class Secrets:
    """Credentials the egress proxy injects into a task's requests: set
    and listed here, never read back."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def set(self, name: str, value: str | bytes) -> Secret:
        return self._c._t.run(ops.set_secret(name, value))

    def list(self) -> list[Secret]:
        return self._c._t.run(ops.list_secrets())

    def remove(self, name: str) -> None:
        self._c._t.run(ops.remove_secret(name))


class Files:
    """The files of a task's sandbox, by sandbox path."""

    def __init__(self, task: Task) -> None:
        self._task = task

    def read(self, path: str) -> bytes:
        return self._task._run(ops.read_file(self._task.id, path))

    def write(self, path: str, data: bytes | str) -> None:
        self._task._run(ops.write_file(self._task.id, path, data))

    def list(self, path: str) -> list[DirEntry]:
        return self._task._run(ops.list_files(self._task.id, path))


class Task:
    """One task. `info` is what the daemon said of it last; `refresh()` asks
    again."""

    def __init__(self, client: Client, info: TaskInfo) -> None:
        self._c = client
        self.id = info.id
        self.info = info
        self.files = Files(self)

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.info.state}>"

    def _run(self, op: ops.Op[Any]) -> Any:
        return self._c._t.run(op)

    def _update(self, info: TaskInfo) -> Task:
        self.info = info
        return self

    @property
    def state(self) -> str:
        return self.info.state

    def refresh(self) -> Task:
        return self._update(self._run(ops.get_task(self.id)))

    def exec(
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
        return self._run(ops.exec_(self.id, cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr))

    def start(
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
    ) -> Process:
        """Starts `cmd` in the background and returns its handle at once: a
        client that goes away leaves it running. `pty=(rows, cols)` gives it
        a terminal; `stdin=True` keeps its stdin open for `write_stdin`."""
        info = self._run(ops.start_process(self.id, cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin, pty=pty, user=user, tag=tag))
        return Process(self, info)

    def processes(self) -> list[ProcessInfo]:
        """The task's background commands, running or ended in the last ten minutes."""
        return self._run(ops.list_processes(self.id))

    def process(self, pid: int) -> Process:
        return Process(self, self._run(ops.get_process(self.id, pid)))

    def url(self, port: int, *, ttl: str | None = None) -> str:
        """A signed link to a server listening on `port` inside the task,
        through the daemon (valid for `ttl`, default 1h)."""
        return self._run(ops.port_url(self.id, port, ttl))

    def snapshot(self, kind: str = "manual", note: str | None = None, *, healthy: bool | None = None, with_memory: bool = False) -> Snapshot:
        """kind: `milestone`, `pre-risk`, `branch` or `manual`. `with_memory`
        (gvisor tasks): also checkpoint the sandbox's processes and memory."""
        return self._run(ops.snapshot(self.id, kind, note, healthy, with_memory))

    def snapshots(self) -> list[Snapshot]:
        return self._run(ops.snapshots(self.id))

    def rollback(self, to: str | None = None, *, last_healthy: bool = False, reason: str) -> RollbackNote:
        """Rolls the task back in place; the note (with `reason`) stays on the
        task for the agent to read."""
        return self._run(ops.rollback(self.id, to, last_healthy, reason))

    def fork(self, from_: str | None = None, count: int = 1) -> list[Task]:
        return [Task(self._c, t) for t in self._run(ops.fork(self.id, from_, count))]

    def wait_for_approval(self, prompt: str, *, timeout: float | None = None, on_wait: Callable[[Wait], None] | None = None) -> Event:
        """Suspends the task until a person approves or rejects at the wait's
        `approval_url` (given to `on_wait`); answers the approval event
        (`event.data["decision"]` is `approve` or `reject`) once the task runs again."""
        return self._run(ops.wait_for(self.id, {"approval": prompt}, timeout, on_wait))

    def wait_for_webhook(self, name: str, *, timeout: float | None = None, on_wait: Callable[[Wait], None] | None = None) -> Event:
        return self._run(ops.wait_for(self.id, {"webhook": name}, timeout, on_wait))

    def wait_for_timer(self, seconds: float, *, timeout: float | None = None, on_wait: Callable[[Wait], None] | None = None) -> Event:
        return self._run(ops.wait_for(self.id, {"timer": f"{int(seconds * 1000)}ms"}, timeout, on_wait))

    def cancel_wait(self) -> Wait:
        """Cancels the task's pending wait (a task suspended for it wakes);
        a blocking wait on it raises. `NotFound` when none is pending."""
        return self._run(ops.cancel_wait(self.id))

    def approve(self, approve: bool = True, comment: str | None = None) -> Any:
        return self._run(ops.approve(self.id, approve, comment))

    def send_event(self, name: str, data: Any = None) -> Any:
        return self._run(ops.send_event(self.id, name, data))

    def suspend(self) -> Task:
        return self._update(self._run(ops.state_change(self.id, "suspend")))

    def resume(self) -> Task:
        return self._update(self._run(ops.state_change(self.id, "resume")))

    def allow(self, *rules: str) -> EgressPolicy:
        return self._run(ops.egress(self.id, allow=rules))

    def deny(self, *rules: str) -> EgressPolicy:
        return self._run(ops.egress(self.id, deny=rules))

    def deliver(
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
        return self._run(ops.deliver(self.id, files, archive, patch, report, complete, out))

    def destroy(self) -> Task:
        return self._update(self._run(ops.destroy(self.id)))


class Process:
    """A background command's handle (`Task.start`)."""

    def __init__(self, task: Task, info: ProcessInfo) -> None:
        self._task = task
        self.id = info.id
        self.info = info

    def __repr__(self) -> str:
        return f"<Process {self.id} of {self._task.id} {'running' if self.info.running else 'ended'}>"

    def output(self) -> ProcessInfo:
        """How it stands, with its output so far."""
        self.info = self._task._run(ops.get_process(self._task.id, self.id))
        return self.info

    def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Waits for its end (at most `timeout` seconds) and returns it."""
        self.info = self._task._run(ops.get_process(self._task.id, self.id, wait=timeout if timeout is not None else 1e9))
        return self.info

    def write_stdin(self, data: bytes | str, *, close: bool = False) -> None:
        self.info = self._task._run(ops.process_stdin(self._task.id, self.id, data, close))

    def close_stdin(self) -> None:
        self.info = self._task._run(ops.process_stdin(self._task.id, self.id, b"", True))

    def resize(self, rows: int, cols: int) -> None:
        self.info = self._task._run(ops.resize_process(self._task.id, self.id, rows, cols))

    def kill(self) -> ProcessInfo:
        """Kills it and everything it started; answers its end."""
        self.info = self._task._run(ops.kill_process(self._task.id, self.id))
        return self.info
