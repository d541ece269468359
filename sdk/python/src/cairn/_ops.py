"""Every operation of the SDK, written once as a generator of HTTP calls
(see `_transport`): the blocking and the asyncio clients both run these."""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterable

from ._errors import CairnError, InvalidRequest, WaitTimeout
from ._models import DirEntry, Delivery, EgressPolicy, Event, ExecResult, ProcessInfo, RollbackNote, Secret, Snapshot, TaskInfo, Wait
from ._transport import Call, Op

#: How long one blocking poll of a wait asks the daemon to hold it.
WAIT_POLL_MS = 30_000


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _size(v: int | str | None) -> str | None:
    return None if v is None else str(v)


def create_task(
    image: str | None = None,
    name: str | None = None,
    *,
    memory: int | str | None = None,
    cpus: float | str | None = None,
    pids: int | str | None = None,
    disk: int | str | None = None,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    allow: Iterable[str] = (),
    deny: Iterable[str] = (),
    services: Iterable[str] = (),
    risky: Iterable[str] = (),
    idle_suspend: str | None = None,
    keep_last: int | None = None,
    expire_after: str | None = None,
    isolation: str | None = None,
) -> Op[TaskInfo]:
    body = _drop_none(
        {
            "image": image,
            "name": name,
            "memory": _size(memory),
            "cpus": _size(cpus),
            "pids": _size(pids),
            "disk": _size(disk),
            "workdir": workdir,
            "idle_suspend": idle_suspend,
            "keep_last": keep_last,
            "expire_after": expire_after,
            "isolation": isolation,
        }
    )
    if env:
        body["env"] = [f"{k}={v}" for k, v in env.items()]
    for key, rules in (("allow", allow), ("deny", deny), ("services", services), ("risky", risky)):
        rules = list(rules)
        if rules:
            body[key] = rules
    v = yield Call("POST", "/v1/tasks", json=body)
    return TaskInfo.from_json(v)


def get_task(task: str) -> Op[TaskInfo]:
    return TaskInfo.from_json((yield Call("GET", f"/v1/tasks/{task}")))


def list_tasks() -> Op[list[TaskInfo]]:
    return [TaskInfo.from_json(t) for t in (yield Call("GET", "/v1/tasks"))]


def destroy(task: str) -> Op[TaskInfo]:
    return TaskInfo.from_json((yield Call("DELETE", f"/v1/tasks/{task}")))


def exec_(
    task: str,
    cmd: str | list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    stdin: str | None = None,
    on_stdout: Callable[[str], None] | None = None,
    on_stderr: Callable[[str], None] | None = None,
) -> Op[ExecResult]:
    argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    body = _drop_none({"cmd": argv, "env": env, "cwd": cwd, "timeout": timeout, "stdin": stdin})
    path = f"/v1/tasks/{task}/exec"
    if on_stdout is None and on_stderr is None:
        return ExecResult.from_json((yield Call("POST", path, json=body)))
    out: list[str] = []
    err: list[str] = []

    def on_event(name: str, data: Any) -> None:
        text = data.get("data", "") if isinstance(data, dict) else ""
        if name == "stdout":
            out.append(text)
            if on_stdout:
                on_stdout(text)
        elif name == "stderr":
            err.append(text)
            if on_stderr:
                on_stderr(text)

    end = yield Call("POST", path, json=body, on_event=on_event)
    return ExecResult.from_json(end, "".join(out), "".join(err))


def start_process(
    task: str,
    cmd: str | list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    stdin: bool = False,
    pty: tuple[int, int] | None = None,
    user: str | None = None,
    tag: str | None = None,
) -> Op[ProcessInfo]:
    argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    body: dict[str, Any] = _drop_none({"argv": argv, "workdir": cwd, "user": user, "tag": tag})
    body["stdin"] = stdin
    if env:
        body["env"] = [f"{k}={v}" for k, v in env.items()]
    if timeout is not None:
        body["timeout_ms"] = int(timeout * 1000)
    if pty is not None:
        body["tty"] = {"rows": pty[0], "cols": pty[1]}
    return ProcessInfo.from_json((yield Call("POST", f"/v1/tasks/{task}/processes", json=body)))


def get_process(task: str, pid: int, wait: float | None = None) -> Op[ProcessInfo]:
    """The command and its output so far; with `wait` (seconds), after its
    end unless the wait runs out first."""
    if wait is None:
        return ProcessInfo.from_json((yield Call("GET", f"/v1/tasks/{task}/processes/{pid}")))
    deadline = time.monotonic() + wait
    while True:
        left = max(0.0, deadline - time.monotonic())
        info = ProcessInfo.from_json((yield Call("GET", f"/v1/tasks/{task}/processes/{pid}", params={"wait_ms": int(min(left, 300) * 1000)})))
        if not info.running or time.monotonic() >= deadline:
            return info


def list_processes(task: str) -> Op[list[ProcessInfo]]:
    return [ProcessInfo.from_json(p) for p in (yield Call("GET", f"/v1/tasks/{task}/processes"))]


def process_stdin(task: str, pid: int, data: bytes | str, close: bool = False) -> Op[ProcessInfo]:
    content = data.encode() if isinstance(data, str) else bytes(data)
    params = {"close": "true"} if close else None
    return ProcessInfo.from_json((yield Call("POST", f"/v1/tasks/{task}/processes/{pid}/stdin", params=params, content=content)))


def resize_process(task: str, pid: int, rows: int, cols: int) -> Op[ProcessInfo]:
    return ProcessInfo.from_json((yield Call("POST", f"/v1/tasks/{task}/processes/{pid}/resize", json={"rows": rows, "cols": cols})))


def kill_process(task: str, pid: int) -> Op[ProcessInfo]:
    return ProcessInfo.from_json((yield Call("POST", f"/v1/tasks/{task}/processes/{pid}/kill", json={})))


def port_url(task: str, port: int, ttl: str | None = None) -> Op[str]:
    params = {"ttl": ttl} if ttl else None
    return (yield Call("POST", f"/v1/tasks/{task}/port-links/{port}", params=params, json={}))["url"]


def _path_query(path: str | bytes) -> str:
    """`path=` with the path's bytes percent-encoded: a sandbox name need not
    be UTF-8, and a str from a listing carries such bytes as surrogates
    (`os.fsencode` gives them back), as `os.listdir` names do."""
    raw = path if isinstance(path, bytes) else os.fsencode(path)
    return "path=" + urllib.parse.quote(raw, safe="/")


def read_file(task: str, path: str | bytes) -> Op[bytes]:
    return (yield Call("GET", f"/v1/tasks/{task}/file?{_path_query(path)}", answer="bytes"))


def write_file(task: str, path: str | bytes, data: bytes | str) -> Op[None]:
    content = data.encode() if isinstance(data, str) else bytes(data)
    yield Call("PUT", f"/v1/tasks/{task}/file?{_path_query(path)}", content=content)


def list_files(task: str, path: str | bytes) -> Op[list[DirEntry]]:
    v = yield Call("GET", f"/v1/tasks/{task}/dir?{_path_query(path)}")
    return [DirEntry.from_json(e) for e in v["entries"]]


def snapshot(task: str, kind: str = "manual", note: str | None = None, healthy: bool | None = None, with_memory: bool = False) -> Op[Snapshot]:
    body = _drop_none({"kind": kind, "note": note, "healthy": healthy})
    if with_memory:
        body["with_memory"] = True
    v = yield Call("POST", f"/v1/tasks/{task}/snapshots", json=body)
    return Snapshot.from_json(v)


def snapshots(task: str) -> Op[list[Snapshot]]:
    return [Snapshot.from_json(s) for s in (yield Call("GET", f"/v1/tasks/{task}/snapshots"))]


def rollback(task: str, to: str | None, last_healthy: bool, reason: str) -> Op[RollbackNote]:
    if (to is None) == (not last_healthy):
        raise InvalidRequest("rollback needs exactly one of to=SNAPSHOT or last_healthy=True")
    if not reason or not reason.strip():
        raise InvalidRequest("rollback needs a reason: the agent reads it to not repeat what failed")
    body = {"reason": reason, **({"to": to} if to is not None else {"last_healthy": True})}
    v = yield Call("POST", f"/v1/tasks/{task}/rollback", json=body)
    return RollbackNote.from_json(v["rollback_note"])


def fork(task: str, from_: str | None, count: int) -> Op[list[TaskInfo]]:
    v = yield Call("POST", f"/v1/tasks/{task}/fork", json=_drop_none({"from": from_, "count": count}))
    return [TaskInfo.from_json(t) for t in v]


def wait_for(task: str, what: dict[str, Any], timeout: float | None, on_wait: Callable[[Wait], None] | None) -> Op[Event]:
    """Asks for the wait (the task is suspended), then holds until it is
    satisfied and the task runs again; answers the event that woke it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    w = Wait.from_json((yield Call("POST", f"/v1/tasks/{task}/waits", json=what)))
    if on_wait is not None:
        on_wait(w)
    while not w.woken:
        if w.state == "cancelled":
            raise CairnError(f"wait {w.id} of task {task} was cancelled", code="conflict")
        if w.task_state in ("failed", "destroyed", "completed"):
            raise CairnError(f"task {task} is {w.task_state}: wait {w.id} will not wake it", code="conflict")
        block = WAIT_POLL_MS
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"wait {w.id} of task {task} is still {w.state} (task {w.task_state}) after {timeout}s")
            block = max(1, min(block, int(left * 1000)))
        w = Wait.from_json((yield Call("GET", f"/v1/waits/{w.id}", params={"block_ms": block})))
    if w.event is None:
        raise CairnError(f"wait {w.id} is satisfied but names no event", code="protocol")
    return w.event


def cancel_wait(task: str) -> Op[Wait]:
    return Wait.from_json((yield Call("DELETE", f"/v1/tasks/{task}/waits")))


def approve(task: str, approve: bool, comment: str | None) -> Op[Any]:
    return (yield Call("POST", f"/v1/tasks/{task}/approve", json=_drop_none({"approve": approve, "comment": comment})))


def send_event(task: str, name: str, data: Any) -> Op[Any]:
    return (yield Call("POST", f"/v1/tasks/{task}/inbox", json={"name": name, "data": data}))


def state_change(task: str, verb: str) -> Op[TaskInfo]:
    return TaskInfo.from_json((yield Call("POST", f"/v1/tasks/{task}/{verb}")))


def egress(task: str, allow: Iterable[str] = (), deny: Iterable[str] = ()) -> Op[EgressPolicy]:
    v = yield Call("POST", f"/v1/tasks/{task}/egress", json={"allow": list(allow), "deny": list(deny)})
    return EgressPolicy.from_json(v)


def deliver(
    task: str,
    files: Iterable[str] = (),
    archive: str | None = None,
    patch: bool = False,
    report: str | None = None,
    complete: bool = False,
    out: str | os.PathLike[str] | None = None,
) -> Op[Delivery]:
    body: dict[str, Any] = _drop_none({"files": list(files), "archive": archive, "report": report})
    body["patch"], body["complete"] = patch, complete
    out_dir = Path(out) if out is not None else None
    if out_dir is not None and out_dir.exists() and any(out_dir.iterdir()):
        raise InvalidRequest(f"out={out_dir}: the directory exists and is not empty")
    v = yield Call("POST", f"/v1/tasks/{task}/deliveries", json=body)
    delivery = Delivery.from_json(v)
    if out_dir is None:
        return delivery
    out_dir.mkdir(parents=True, exist_ok=True)
    for d in delivery.deliverables:
        if "/" in d.name or d.name in ("", ".", "..", "record.json"):
            raise CairnError(f"deliverable name {d.name!r} is not a plain file name", code="protocol")
        data = yield Call("GET", f"/v1/deliverables/{d.sha256}", answer="bytes")
        (out_dir / d.name).write_bytes(data)
    record = yield Call("GET", f"/v1/records/{delivery.record_id}", answer="bytes")
    record_path = out_dir / "record.json"
    record_path.write_bytes(record)
    return Delivery.from_json(v, str(record_path))


def set_secret(name: str, value: str | bytes) -> Op[Secret]:
    content = value.encode() if isinstance(value, str) else bytes(value)
    return Secret.from_json((yield Call("PUT", f"/v1/secrets/{name}", content=content)))


def list_secrets() -> Op[list[Secret]]:
    return [Secret.from_json(v) for v in (yield Call("GET", "/v1/secrets"))]


def remove_secret(name: str) -> Op[None]:
    yield Call("DELETE", f"/v1/secrets/{name}")
