"""Redis error replies: what the server said (with the code redis-py strips put
back) and whose fault it is."""

from __future__ import annotations

import redis

from ...models import ErrorClass

# Error replies that mean "Redis cannot take writes now", not "this message is bad".
_UNAVAILABLE_PREFIXES = ("OOM", "BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS",
                         "MOVED", "ASK")
# redis-py exception classes whose reply code it strips from the text (older
# redis-py versions have no `status_code` attribute to recover it from).
_CODE_OF_CLASS = tuple(
    (code, getattr(redis.exceptions, name))
    for code, name in (("MOVED", "MovedError"), ("ASK", "AskError"), ("OOM", "OutOfMemoryError"), ("READONLY", "ReadOnlyError"), ("LOADING", "BusyLoadingError"),
                       ("TRYAGAIN", "TryAgainError"), ("CLUSTERDOWN", "ClusterDownError"),
                       ("MASTERDOWN", "MasterDownError"))
    if hasattr(redis.exceptions, name)
)
# Error replies that are this message's fault (e.g. the stream key holds another type).
_PERMANENT_PREFIXES = ("WRONGTYPE",)


def classify_reply_error(text: str) -> ErrorClass:
    """Map a Redis error reply (e.g. ``"WRONGTYPE Operation against a key …"``) to an error class."""
    upper = text.lstrip().upper()
    if upper.startswith(_PERMANENT_PREFIXES):
        return ErrorClass.PERMANENT
    if upper.startswith(_UNAVAILABLE_PREFIXES):
        return ErrorClass.DOWNSTREAM_UNAVAILABLE
    return ErrorClass.TRANSIENT


def reply_error_text(exc: Exception) -> str:
    """The error reply as Redis sent it, code first (``"OOM command not allowed …"``).

    redis-py strips the code of replies it maps to its own exception classes
    (OutOfMemoryError, ReadOnlyError, BusyLoadingError, …) and keeps it in
    `status_code`; put it back so classification sees what the server said.
    """
    text = str(exc)
    code = getattr(exc, "status_code", None)
    if not code:
        code = next((c for c, cls in _CODE_OF_CLASS if isinstance(exc, cls)), None)
    if code and not text.upper().startswith(code):
        return f"{code} {text}"
    return text
