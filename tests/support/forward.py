"""The TCP forwarder lives with the workstation tools (`outbox local` binds one
to the Docker bridge); the integration tests cut its connections to imitate a
partition or a failover. `LosingForwarder` (tests only) loses an HTTP server's
answers after the server has the request, as a lost SES answer is lost."""

import socket
import threading
import time
from typing import Callable

from outbox_tools.forward import Forwarder, _end

__all__ = ["Forwarder", "LosingForwarder"]

_BODY = b'{"message": "Internal failure"}'
#: An AWS JSON-protocol error answer: 500, InternalFailure; then the connection closes.
_INTERNAL_FAILURE = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                     b"x-amzn-ErrorType: InternalFailure\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY)


class LosingForwarder(Forwarder):
    """A forwarder in front of an HTTP server (moto) that loses the answers to the
    next `lose` requests after the server has them: ``drop`` ends the client's
    connection when the answer comes (the connection dropped after the request
    went out), ``late`` holds the answer for `late_seconds` (past the client's
    read timeout) before passing it on, ``5xx`` answers 500 InternalFailure in
    its place (a server error after the body was sent). The first `after` answers,
    and those after the lost ones, pass through. `on_lost()`, when given, runs as
    each answer is being lost: the server has the request, the client still waits."""

    def __init__(self, target_host: str, target_port: int, *, mode: str = "drop", lose: int = 1,
                 late_seconds: float = 2.0, after: int = 0, on_lost: Callable[[], None] | None = None) -> None:
        super().__init__("127.0.0.1", target_host, target_port)
        if mode not in ("drop", "late", "5xx"):
            raise ValueError("mode must be drop, late or 5xx")
        self.mode, self.lose, self.late_seconds = mode, lose, late_seconds
        self.after = after  # answers passed on before the first one lost (GetAccount's, say)
        self.lost = 0
        self.on_lost = on_lost
        self._lose_lock = threading.Lock()

    def _take_one(self) -> bool:
        with self._lose_lock:
            if self.after > 0:
                self.after -= 1
                return False
            if self.lose <= 0:
                return False
            self.lose -= 1
            self.lost += 1
            return True

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            answers = source.getpeername() == self.target  # the server's side: what it says is an answer
        except OSError:
            answers = False
        if not answers:
            return super()._pump(source, sink)
        try:
            while chunk := source.recv(65536):
                # An answer starts with its status line; the chunks after it (its body) follow its fate.
                if chunk.startswith(b"HTTP/") and self._take_one():
                    if self.on_lost is not None:
                        self.on_lost()
                    if self.mode == "drop":
                        break
                    if self.mode == "5xx":
                        sink.sendall(_INTERNAL_FAILURE)
                        break
                    time.sleep(self.late_seconds)  # the client has timed out and gone by then
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                _end(sock)
                with self._lock:
                    self._open.discard(sock)
