"""Redis error replies: what the server said, and whose fault it is."""

from __future__ import annotations

import redis

from ...models import ErrorClass

# Error replies that mean "Redis cannot take writes now", not "this message is bad".
_UNAVAILABLE_PREFIXES = ("OOM", "BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS",
                         "MOVED", "ASK")
# Exception classes whose reply code redis-py strips (older ones have no `status_code`).
_CODE_OF_CLASS = tuple(
    (code, getattr(redis.exceptions, name))
    for code, name in (("MOVED", "MovedError"), ("ASK", "AskError"), ("OOM", "OutOfMemoryError"), ("READONLY", "ReadOnlyError"), ("LOADING", "BusyLoadingError"),
                       ("TRYAGAIN", "TryAgainError"), ("CLUSTERDOWN", "ClusterDownError"),
                       ("MASTERDOWN", "MasterDownError"))
    if hasattr(redis.exceptions, name)
)
_PERMANENT_PREFIXES = ("WRONGTYPE",)


def classify_reply_error(text: str) -> ErrorClass:
    upper = text.lstrip().upper()
    if upper.startswith(_PERMANENT_PREFIXES):
        return ErrorClass.PERMANENT
    if upper.startswith(_UNAVAILABLE_PREFIXES):
        return ErrorClass.DOWNSTREAM_UNAVAILABLE
    return ErrorClass.TRANSIENT


def reply_error_text(exc: Exception) -> str:
    """The error reply as Redis sent it, with the code redis-py strips put back first."""
    text = str(exc)
    code = getattr(exc, "status_code", None)
    if not code:
        code = next((c for c, cls in _CODE_OF_CLASS if isinstance(exc, cls)), None)
    if code and not text.upper().startswith(code):
        return f"{code} {text}"
    return text
