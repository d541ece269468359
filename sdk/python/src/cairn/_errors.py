"""Errors: every failure of a call is a CairnError carrying the API's code."""

from __future__ import annotations


class CairnError(Exception):
    """A call that failed. `code` is the API's stable error code (`not_found`,
    `conflict`, ...), or `unreachable`/`timeout`/`protocol` for failures on
    this side; `status` is the HTTP status, when there was one."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidRequest(CairnError):
    code = "invalid"


class Unauthorized(CairnError):
    code = "unauthorized"


class Forbidden(CairnError):
    code = "forbidden"


class NotFound(CairnError):
    code = "not_found"


class Conflict(CairnError):
    code = "conflict"


class TooLarge(CairnError):
    code = "too_large"


class TooManyRequests(CairnError):
    """More at once than a bound of the daemon's `[limits]` allows (429); try again later."""

    code = "too_many_requests"


class Unavailable(CairnError):
    code = "unavailable"


class NoSpace(CairnError):
    code = "no_space"


class InternalError(CairnError):
    code = "internal"


class DaemonUnreachable(CairnError):
    """No daemon answered at the URL (or none was found to ask)."""

    code = "unreachable"


class WaitTimeout(CairnError):
    """A blocking wait gave up before the task was woken; the wait goes on."""

    code = "timeout"


class ProtocolError(CairnError):
    """The daemon answered something this SDK cannot read."""

    code = "protocol"


_BY_CODE: dict[str, type[CairnError]] = {
    cls.code: cls
    for cls in (InvalidRequest, Unauthorized, Forbidden, NotFound, Conflict, TooLarge, TooManyRequests, Unavailable, NoSpace, InternalError)
}


def error_for(status: int | None, body: bytes) -> CairnError:
    """The error of a failed answer: its `{"error": {"code", "message"}}` body,
    or the status alone when the body is not one."""
    import json

    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip().splitlines()
        return CairnError(text[0] if text else f"HTTP {status}", code="http_error", status=status)
    cls = _BY_CODE.get(code, CairnError)
    return cls(message, code=code, status=status)
