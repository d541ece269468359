"""Cairn's Python SDK: tasks in sandboxes over durable state.

    import cairn
    c = cairn.Client()                      # CAIRN_URL/CAIRN_TOKEN, else $CAIRN_HOME
    task = c.tasks.create(image="host")
    print(task.exec(["echo", "hi"]).stdout)
    task.files.write("/workspace/a.txt", b"hello")
    snap = task.snapshot(kind="milestone", note="hello written")

`cairn.AsyncClient` has the same calls, awaited.
"""

from ._async import AsyncClient, AsyncFiles, AsyncProcess, AsyncSecrets, AsyncTask, AsyncTasks
from ._errors import (
    CairnError,
    Conflict,
    DaemonUnreachable,
    Forbidden,
    InternalError,
    InvalidRequest,
    NoSpace,
    NotFound,
    ProtocolError,
    TooLarge,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from ._models import Deliverable, Delivery, DirEntry, EgressPolicy, Event, ExecResult, ProcessInfo, RollbackNote, Secret, Snapshot, TaskInfo, Wait
from ._sync import Client, Files, Process, Secrets, Task, Tasks
from ._verify import VerifyError, verify, verify_or_raise

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncFiles",
    "AsyncProcess",
    "AsyncSecrets",
    "AsyncTask",
    "AsyncTasks",
    "CairnError",
    "Client",
    "Conflict",
    "DaemonUnreachable",
    "Deliverable",
    "Delivery",
    "DirEntry",
    "EgressPolicy",
    "Event",
    "ExecResult",
    "Files",
    "Forbidden",
    "InternalError",
    "InvalidRequest",
    "NoSpace",
    "NotFound",
    "Process",
    "ProcessInfo",
    "ProtocolError",
    "RollbackNote",
    "Secret",
    "Secrets",
    "Snapshot",
    "Task",
    "TaskInfo",
    "Tasks",
    "TooLarge",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "VerifyError",
    "Wait",
    "WaitTimeout",
    "verify",
    "verify_or_raise",
]
