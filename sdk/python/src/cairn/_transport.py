"""Finding the daemon, and what the two drivers of `_ops` over HTTP share
(the asyncio one in `_async.py`, the blocking one generated from it in
`_sync.py`). Operations are generators that yield `Call`s and receive their
answers, so each one is written once for both clients."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, TypeVar

import httpx

from ._errors import CairnError, DaemonUnreachable, ProtocolError, error_for

T = TypeVar("T")

#: Who acts, in the task's event log.
ACTOR = "sdk:python"


@dataclass
class Call:
    """One HTTP request of an operation."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    #: `json` (decoded), `bytes` (the body as is) or `none`.
    answer: str = "json"
    #: For server-sent events: called with each event's name and data; the
    #: call answers the data of the last event (`exit`), and an `error`
    #: event raises.
    on_event: Callable[[str, Any], None] | None = None


Op = Generator[Call, Any, T]


def default_home() -> Path:
    """The daemon's home as the CLI finds it: `$CAIRN_HOME`, else
    `/var/lib/cairn` for root, else `$XDG_DATA_HOME/cairn` or
    `~/.local/share/cairn`."""
    if os.environ.get("CAIRN_HOME"):
        return Path(os.environ["CAIRN_HOME"])
    if os.geteuid() == 0:
        return Path("/var/lib/cairn")
    if os.environ.get("XDG_DATA_HOME"):
        return Path(os.environ["XDG_DATA_HOME"]) / "cairn"
    return Path(os.environ.get("HOME", "/")) / ".local" / "share" / "cairn"


def discover(url: str | None, token: str | None, home: str | os.PathLike[str] | None) -> tuple[str, str]:
    """The daemon's URL and token: as given, else `CAIRN_URL`/`CAIRN_TOKEN`,
    else the `url` and `token` files of the home."""
    root = Path(home) if home is not None else default_home()
    url = url or os.environ.get("CAIRN_URL") or None
    if url is None:
        try:
            url = (root / "url").read_text().strip()
        except OSError:
            raise DaemonUnreachable(f"daemon not running: no {root / 'url'} (start it with `cairn serve`, or set CAIRN_URL)") from None
    token = token or os.environ.get("CAIRN_TOKEN") or None
    if token is None:
        try:
            token = (root / "token").read_text().strip()
        except OSError as e:
            raise CairnError(f"cannot read the daemon's token {root / 'token'}: {e.strerror} (set CAIRN_TOKEN)", code="unauthorized") from None
    return url.rstrip("/"), token


def headers(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "x-cairn-actor": ACTOR}


def timeouts(timeout: float | None) -> httpx.Timeout:
    # Commands and blocking waits answer when they end: no read timeout by
    # default, but connecting to a dead daemon fails fast.
    return httpx.Timeout(timeout, connect=10.0)


class SseParser:
    """Server-sent events, line by line."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> tuple[str, Any] | None:
        if line == "":
            if not self.data:
                self.event = "message"
                return None
            event, data = self.event, "\n".join(self.data)
            self.event, self.data = "message", []
            try:
                return event, json.loads(data)
            except ValueError:
                raise ProtocolError(f"event {event!r} carries data that is not JSON: {data[:80]!r}") from None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


def decode(call: Call, status: int, body: bytes) -> Any:
    if status >= 400:
        raise error_for(status, body)
    if call.answer == "bytes":
        return body
    if call.answer == "none" or not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        raise ProtocolError(f"{call.method} {call.path}: the answer is not JSON") from None


def event_result(call: Call, event: str, data: Any, last: list[Any]) -> bool:
    """Hands one event to the call; true when it ends the stream."""
    if event == "error":
        # The data is the API's error body; the stream's status was 200.
        raise error_for(None, json.dumps(data).encode())
    if event == "exit":
        last.append(data)
        return True
    assert call.on_event is not None
    call.on_event(event, data)
    return False


def request_args(call: Call) -> dict[str, Any]:
    args: dict[str, Any] = {"params": call.params}
    if call.json is not None:
        args["json"] = call.json
    if call.content is not None:
        args["content"] = call.content
        args["headers"] = {"content-type": "application/octet-stream"}
    if call.on_event is not None:
        args["headers"] = {"accept": "text/event-stream"}
    return args


def unreachable(url: str, e: Exception) -> DaemonUnreachable:
    return DaemonUnreachable(f"cannot reach the daemon at {url}: {e}")

