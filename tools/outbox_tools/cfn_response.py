"""CloudFormation's side of a custom resource, on a workstation: an HTTP server
that takes the response a custom resource function PUTs to its `ResponseURL`
(in AWS, a pre-signed S3 URL) and keeps it.

- `ResponseServer`: in a test, the sample event's `ResponseURL` is pointed at
  `server.url(...)`; `wait_for(n)` returns what arrived (path, headers, JSON body).
- ``python -m outbox_tools.cfn_response --host 0.0.0.0 --port 8099`` prints each
  response as one JSON line, for ``sam local invoke MigrationFunction -e
  events/migrate-create.json`` (whose `ResponseURL` is
  ``http://host.docker.internal:8099/…``; docs/deploying.md).

Nothing here is used by the deployed functions.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass(frozen=True)
class Response:
    """One PUT as received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class ResponseServer:
    """A threaded HTTP server recording every PUT. Answers 200 like S3 does."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 on_response: Callable[[Response], None] | None = None) -> None:
        self.responses: list[Response] = []
        self._arrived = threading.Condition()
        self._on_response = on_response
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    self.send_error(400, "the body is not JSON")
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                server._record(Response(self.path, dict(self.headers.items()), body))

            def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read `responses`
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="cfn-response", daemon=True)

    def _record(self, response: Response) -> None:
        with self._arrived:
            self.responses.append(response)
            self._arrived.notify_all()
        if self._on_response is not None:
            self._on_response(response)

    def url(self, path: str = "/cloudformation-response") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def wait_for(self, count: int = 1, timeout: float = 30.0) -> list[Response]:
        """The first `count` responses, waiting at most `timeout` seconds for them."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.responses) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.responses)} of {count} custom resource responses in {timeout:g}s")
                self._arrived.wait(left)
            return list(self.responses[:count])

    def __enter__(self) -> "ResponseServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def main(argv: list[str] | None = None) -> int:
    """``python -m outbox_tools.cfn_response``: print custom resource responses until Ctrl-C."""
    ap = argparse.ArgumentParser(prog="python -m outbox_tools.cfn_response",
                                 description="take the responses a custom resource function sends to CloudFormation")
    ap.add_argument("--host", default="127.0.0.1", help="interface (0.0.0.0 for sam local invoke in Docker)")
    ap.add_argument("--port", type=int, default=8099)
    args = ap.parse_args(argv)

    def show(response: Response) -> None:
        print(json.dumps({"path": response.path, **response.body}), flush=True)

    with ResponseServer(args.host, args.port, on_response=show) as server:
        print(f"custom resource responses at {server.url('/')}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
