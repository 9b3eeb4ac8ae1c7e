"""Network faults for the integration tests: a TCP proxy in front of the real
Redis whose connections can be cut, as a partition or a failover would."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

import pytest


class CuttableProxy:
    """A TCP proxy in front of the real Redis whose connections can be cut, as a
    network partition or a failover would (real sockets, real client errors)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.cut_now = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_now:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.cut_now = True
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


@pytest.fixture
def tcp_redis(servers):
    parsed = urlparse(servers.redis_url)
    if parsed.scheme not in ("redis", "rediss") or not parsed.port:
        pytest.skip("needs Redis over TCP")
    proxy = CuttableProxy((parsed.hostname, parsed.port))
    yield proxy
    proxy.cut()
