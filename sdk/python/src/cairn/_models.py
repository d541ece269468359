"""What the daemon answers, as typed objects. Each keeps the whole answer in
`raw`, so fields this version does not name are still there."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class RollbackNote:
    """Why the task's work was last undone: an agent reads it to not repeat it."""

    from_: str | None
    to: str
    from_step: int | None
    reason: str
    time_ms: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    #: Which snapshot was chosen and why (``--last-healthy: ...`` or ``--to: ...``).
    chosen: str | None = None

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> RollbackNote:
        return cls(v.get("from"), v.get("to", ""), v.get("from_step"), v.get("reason", ""), v.get("time_ms"), v, v.get("chosen"))


@dataclass(frozen=True)
class TaskInfo:
    """A task as the daemon describes it (`GET /v1/tasks/{id}`)."""

    id: str
    name: str | None
    state: str
    step: int
    sandbox: str | None
    rollback_note: RollbackNote | None
    recovery_note: Any
    created_ms: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> TaskInfo:
        note = v.get("rollback_note")
        return cls(
            v["id"],
            v.get("name"),
            v.get("state", ""),
            v.get("step", 0),
            v.get("sandbox"),
            RollbackNote.from_json(note) if note else None,
            v.get("recovery_note"),
            v.get("created_ms"),
            v,
        )


@dataclass(frozen=True)
class ExecResult:
    """A command's end: exit code (None when a signal ended it) and output.
    Output past the daemon's cap is cut, and `truncated` says so."""

    exit_code: int | None
    stdout: str
    stderr: str
    signal: int | None = None
    oom_killed: bool = False
    timed_out: bool = False
    duration_ms: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_json(cls, v: dict[str, Any], stdout: str | None = None, stderr: str | None = None) -> ExecResult:
        return cls(
            v.get("exit_code"),
            v.get("stdout", "") if stdout is None else stdout,
            v.get("stderr", "") if stderr is None else stderr,
            v.get("signal"),
            bool(v.get("oom_killed")),
            bool(v.get("timed_out")),
            float(v.get("duration_ms") or 0.0),
            bool(v.get("truncated")),
        )


@dataclass(frozen=True)
class DirEntry:
    name: str
    """The name; one that is not UTF-8 holds its other bytes as surrogates,
    as `os.listdir` gives them (`os.fsencode(name)` is its bytes), so it
    can be read back by joining it into a path."""
    kind: str
    """`file`, `dir`, `symlink` or `other`."""
    size: int
    mode: int
    mtime_ms: int
    target: str | None = None

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> DirEntry:
        return cls(_name(v), v["kind"], v.get("size", 0), v.get("mode", 0), v.get("mtime_ms", 0), v.get("target"))


def _name(v: dict[str, Any]) -> str:
    """An entry's exact name: from `name_b64` when the daemon gave one (the
    name is not UTF-8), else `name`."""
    try:
        return os.fsdecode(base64.b64decode(v["name_b64"], validate=True)) if v.get("name_b64") else v["name"]
    except ValueError:  # binascii.Error: not base64, so not the daemon's
        return v["name"]


@dataclass(frozen=True)
class Snapshot:
    id: str
    task: str
    kind: str
    note: str | None
    healthy: bool | None
    step: int
    files: int
    added_bytes: int
    raw: dict[str, Any] = field(repr=False, compare=False)
    # Holds a checkpoint of the sandbox's processes and memory (gvisor).
    with_memory: bool = False

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Snapshot:
        return cls(
            v["id"], v.get("task", ""), v.get("kind", ""), v.get("note"), v.get("healthy"), v.get("step", 0), v.get("files", 0), v.get("added_bytes", 0), v,
            v.get("with_memory", False),
        )


@dataclass(frozen=True)
class Event:
    """An event that reached the task's inbox: an approval, a webhook, a timer
    or an operator's event. `data` is what it carried."""

    id: str
    source: str
    name: str | None
    data: Any
    received_ms: int | None
    wait: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Event:
        return cls(v["id"], v.get("source", ""), v.get("name"), v.get("data"), v.get("received_ms"), v.get("wait"), v)


@dataclass(frozen=True)
class Wait:
    """A wait of a task: pending until its event arrives, while the task is
    suspended. `approval_url` is the signed page a person approves at;
    `webhook_url` where a sender posts."""

    id: str
    task: str
    kind: str
    state: str
    task_state: str
    approval_url: str | None
    webhook_url: str | None
    event: Event | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def woken(self) -> bool:
        """Satisfied, and the task runs again."""
        return self.state == "satisfied" and self.task_state == "running"

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Wait:
        ev = v.get("event")
        return cls(
            v["id"],
            v.get("task", ""),
            v.get("kind", ""),
            v.get("state", ""),
            v.get("task_state", ""),
            v.get("approval_url"),
            v.get("webhook_url"),
            Event.from_json(ev) if ev else None,
            v,
        )


@dataclass(frozen=True)
class Deliverable:
    name: str
    kind: str
    source: str | None
    sha256: str
    size: int

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Deliverable:
        return cls(v["name"], v.get("kind", ""), v.get("source"), v["sha256"], v.get("size", 0))


@dataclass(frozen=True)
class Delivery:
    """What `deliver` stored: the signed record's id, the deliverables, the
    ledger entry it is anchored to, and where `out=` wrote them."""

    task: str
    record_id: str
    deliverables: list[Deliverable]
    ledger_seq: int
    ledger_head: str
    completed: bool
    record_path: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, v: dict[str, Any], record_path: str | None = None) -> Delivery:
        return cls(
            v["task"],
            v["record_id"],
            [Deliverable.from_json(d) for d in v.get("deliverables", [])],
            v.get("ledger_seq", 0),
            v.get("ledger_head", ""),
            bool(v.get("completed")),
            record_path,
            v,
        )


@dataclass(frozen=True)
class EgressPolicy:
    allow: list[str]
    deny: list[str]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> EgressPolicy:
        return cls(list(v.get("allow", [])), list(v.get("deny", [])), v)


@dataclass(frozen=True)
class ProcessInfo:
    """A command running in the background, with its handle (`id`), and its
    output so far (the last MiB of each stream; UTF-8, invalid bytes
    replaced). `exit_code` is set once it has ended (None when a signal
    ended it; `signal` says which)."""

    id: int
    task: str
    argv: list[str]
    tag: str | None
    tty: bool
    running: bool
    exit_code: int | None
    signal: int | None
    timed_out: bool
    error: str | None
    stdout: str
    stderr: str
    truncated: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> ProcessInfo:
        exit_ = v.get("exit") or {}
        return cls(
            v["id"], v.get("task", ""), list(v.get("argv", [])), v.get("tag"), bool(v.get("tty")), bool(v.get("running")),
            exit_.get("exit_code") if exit_ and exit_.get("signal") is None else None, exit_.get("signal"), bool(exit_.get("timed_out")),
            v.get("error"), v.get("stdout", ""), v.get("stderr", ""), bool(v.get("truncated")), v,
        )


@dataclass(frozen=True)
class Secret:
    """A secret as the daemon lists it: its name and use, never its value."""

    name: str
    created_ms: int
    updated_ms: int
    last_used_ms: int | None
    uses: int

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Secret:
        return cls(v["name"], v["created_ms"], v["updated_ms"], v.get("last_used_ms"), v.get("uses", 0))


class Schema(NamedTuple):
    """The schema of the daemon's OpenAPI document (`GET /v1/openapi.json`)
    a model mirrors, and the fields that schema requires which the model
    does not read (they stay in `raw`, where it has one)."""

    name: str
    unread: tuple[str, ...] = ()


#: What each model mirrors, named rather than guessed from the class name
#: (`Event` is the schema of an event-log entry; `InboxEvent` is what a wait
#: answers). `tests/test_models.py` checks it against a running daemon: a
#: model reads only fields of its schema, into attributes of types that take
#: them, and every field the schema requires unless listed as unread.
SCHEMAS: dict[type, Schema] = {
    RollbackNote: Schema("RollbackNote"),
    TaskInfo: Schema("TaskView", unread=("config", "memory", "last_activity_ms", "limits")),
    ExecResult: Schema("RunAnswer"),
    DirEntry: Schema("DirEntry"),
    Snapshot: Schema("Snapshot", unread=("memory", "config", "manifest", "bytes", "freeze_ms", "duration_ms", "created_ms")),
    Event: Schema("InboxEvent", unread=("task",)),
    Wait: Schema("WaitView", unread=("created_ms",)),
    Deliverable: Schema("Deliverable"),
    Delivery: Schema("DeliveryView", unread=("record",)),
    EgressPolicy: Schema("EgressView", unread=("task", "decisions")),
    # Also the answer of a start, stdin or kill (`ProcessView`, the same
    # without the output): the output's fields are read with defaults.
    ProcessInfo: Schema("ProcessOutput"),
    Secret: Schema("SecretView"),
}
