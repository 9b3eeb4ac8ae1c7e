"""A PostgreSQL stand-in on a Unix socket that refuses every connection as a server
does when the database does not exist: it reads the startup message, answers one
ErrorResponse (SQLSTATE 3D000) and hangs up ("Message Flow" and "Message Formats",
PostgreSQL documentation, Frontend/Backend Protocol). pg8000 then writes Terminate
into the closed socket, whose broken pipe used to hide the server's error."""

from __future__ import annotations

import socket
import struct
import threading

SSL_REQUEST_CODE = 80877103


class RefusingPostgres:
    def __init__(self, path: str) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen()
        self._thread = threading.Thread(target=self._serve, name="refusing-postgres", daemon=True)

    def __enter__(self) -> "RefusingPostgres":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with client:
                try:
                    self._refuse(client)
                except OSError:
                    pass

    @staticmethod
    def _refuse(client: socket.socket) -> None:
        database = "postgres"
        while True:
            length = struct.unpack("!i", _read(client, 4))[0]
            body = _read(client, length - 4)
            if struct.unpack("!i", body[:4])[0] != SSL_REQUEST_CODE:
                # StartupMessage: protocol version, then name/value pairs
                pairs = body[4:].split(b"\0")
                database = dict(zip(pairs[::2], pairs[1::2])).get(b"database", b"postgres").decode()
                break
            client.sendall(b"N")  # no TLS here
        fields = {"S": "FATAL", "V": "FATAL", "C": "3D000", "M": f'database "{database}" does not exist'}
        payload = b"".join(k.encode() + v.encode() + b"\0" for k, v in fields.items()) + b"\0"
        client.sendall(b"E" + struct.pack("!i", len(payload) + 4) + payload)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data
