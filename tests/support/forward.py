"""A TCP forwarder: listens on one address and relays each connection to a
target, a TCP address or a Unix socket. The sam_local tests bind one to the
Docker bridge's address, so that a Lambda container reaches PostgreSQL and
Redis, which listen on 127.0.0.1 only and are not ours to reconfigure; the
integration tests put one in front of PostgreSQL or Redis and cut its
connections, as a partition or a failover would, and reach the embedded
servers, which listen on Unix sockets only, over TCP through one."""

from __future__ import annotations

import socket
import threading


class Forwarder:
    """Relay connections on (`host`, `port`) (0: a free port) to (`target_host`, `target_port`),
    or, when `target_port` is None, to the Unix socket at path `target_host`."""

    def __init__(self, host: str, target_host: str, target_port: int | None, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server((host, port))
        self.host, self.port = self._listener.getsockname()[:2]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"forward-{self.port}", daemon=True)

    def __enter__(self) -> "Forwarder":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()

    def cut(self) -> None:
        """End every connection (both peers see it closed) and refuse new ones."""
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _end(sock)
            self._open.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect()
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._closed.is_set():  # cut while this one was connecting
                    _end(client)
                    _end(upstream)
                    return
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _connect(self) -> socket.socket:
        host, port = self.target
        if port is not None:
            return socket.create_connection((host, port), timeout=10)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10)
            sock.connect(host)
        except OSError:
            sock.close()
            raise
        return sock

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            # One side ended: end both, as the peer would see a closed connection.
            for sock in (source, sink):
                _end(sock)
                with self._lock:
                    self._open.discard(sock)


def _end(sock: socket.socket) -> None:
    # shutdown first: it wakes a pump blocked in recv on this socket, close alone does not.
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
