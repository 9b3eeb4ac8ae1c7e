"""SES on a workstation: moto in server mode, and botocore hooks for what moto cannot do.

moto 5 records SES v2 sends (in the SES v1 backend's ``sent_messages``) and
rejects unverified senders, but it does not implement SES v2 ``GetAccount``
and never throttles. The product always makes the real ``GetAccount`` call;
for local runs this module supplies the answer moto lacks, in one of two ways:

- `LocalSesServer`: moto in server mode (``moto.server.ThreadedMotoServer``)
  with ``GetAccount`` added to moto's SES v2 responses, answered from moto's own
  state (sent count) and the quota given here. The relay handler reaches it
  through ``AWS_ENDPOINT_URL_SESV2`` exactly as it would under
  ``sam local invoke``; ``python -m outbox_tools.local_ses`` runs one in the
  foreground (docs/channels.md, "Local SES (moto)"); it needs moto, from the
  ``local`` extra (``pip install 'outbox-relay[local]'``) or ``dev``.
- `answer_get_account` / `fail_send_email`: botocore ``before-call`` event hooks on
  one client, for tests: answer ``GetAccount``, or make chosen ``SendEmail``
  calls fail with a given SES error code or a network error.

Nothing here is used by the deployed functions.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any, Callable

#: GetAccount's answer from the local server (changed by `LocalSesServer(...)`).
_ACCOUNT = {"max_send_rate": 50.0, "max_24_hour_send": 50_000.0, "sending_enabled": True}
_install_lock = threading.Lock()


def _moto_get_account(self: Any) -> str:
    """SES v2 GetAccount for moto's SESV2Response (moto has none): quota from
    `_ACCOUNT`, SentLast24Hours from moto's own count of sent recipients."""
    from moto.ses.models import ses_backends

    sent = ses_backends[self.current_account][self.region].sent_message_count
    return json.dumps({
        "SendingEnabled": _ACCOUNT["sending_enabled"],
        "ProductionAccessEnabled": True,
        "EnforcementStatus": "HEALTHY",
        "DedicatedIpAutoWarmupEnabled": False,
        "SendQuota": {"Max24HourSend": _ACCOUNT["max_24_hour_send"], "MaxSendRate": _ACCOUNT["max_send_rate"],
                      "SentLast24Hours": float(sent)},
    })


def install_moto_get_account() -> None:
    """Give moto's SES v2 responses a ``GetAccount`` (once per process, and only
    while moto has none of its own)."""
    from moto.sesv2 import urls
    from moto.sesv2.responses import SESV2Response

    with _install_lock:
        if not hasattr(SESV2Response, "get_account"):
            SESV2Response.get_account = _moto_get_account  # type: ignore[attr-defined]
            # moto's catch-all "/v2/.*" is not a route in server mode; give the account path its own.
            urls.url_paths.setdefault("{0}/v2/email/account$", SESV2Response.dispatch)


class LocalSesServer:
    """moto in server mode with SES v2 ``GetAccount`` answered.

    Args:
        port: TCP port (0: a free one). host: interface to bind (``0.0.0.0`` so a
            Docker container started by ``sam local invoke`` can reach it).
        max_send_rate: MaxSendRate GetAccount reports, emails per second.
        max_24_hour_send: Max24HourSend GetAccount reports (-1: unlimited).

    Use as a context manager; `url` is what AWS_ENDPOINT_URL_SESV2 should hold.
    """

    def __init__(self, port: int = 0, *, host: str = "127.0.0.1", max_send_rate: float = 50.0,
                 max_24_hour_send: float = 50_000.0, region: str = "us-east-1") -> None:
        self.host, self.port, self.region = host, port, region
        self.max_send_rate, self.max_24_hour_send = max_send_rate, max_24_hour_send
        self._server: Any = None

    def start(self) -> "LocalSesServer":
        from moto.server import ThreadedMotoServer

        install_moto_get_account()
        _ACCOUNT.update(max_send_rate=float(self.max_send_rate), max_24_hour_send=float(self.max_24_hour_send))
        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        self.reset()  # moto's state is per process: start from nothing, as a new server would
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> "LocalSesServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def client(self) -> Any:
        """A boto3 sesv2 client on this server (dummy credentials)."""
        import boto3

        return boto3.client("sesv2", endpoint_url=self.url, region_name=self.region,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def verify(self, *identities: str) -> None:
        """Create (and, in moto, verify at once) these email or domain identities."""
        client = self.client()
        for identity in identities:
            client.create_email_identity(EmailIdentity=identity)

    def reset(self) -> None:
        """Forget every identity and sent message (``POST /moto-api/reset``)."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=5)

    def sent_messages(self, account_id: str | None = None) -> list[Any]:
        """What moto recorded (v1 backend ``sent_messages``: ``Message`` with
        source/destinations/subject/body, or ``RawMessage`` with raw_data), in
        send order. Works for a server running in this process."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ses.models import ses_backends

        return list(ses_backends[account_id or DEFAULT_ACCOUNT_ID][self.region].sent_messages)


# --- botocore hooks for tests ------------------------------------------------------------------

class _HookResponse:
    """The minimal HTTP response botocore needs from a before-call hook."""

    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.headers: dict[str, str] = {}
        self.content = b""
        self.text = ""
        self.raw = None


def _error(code: str, message: str, status: int) -> tuple[_HookResponse, dict[str, Any]]:
    return _HookResponse(status), {"Error": {"Code": code, "Message": message},
                                   "ResponseMetadata": {"HTTPStatusCode": status}}


def answer_get_account(client: Any, *, sending_enabled: bool = True, enforcement_status: str = "HEALTHY",
                       max_send_rate: float = 50.0, max_24_hour_send: float = 50_000.0,
                       sent_last_24_hours: float = 0.0,
                       error: tuple[str, str, int] | None = None) -> Callable[[], None]:
    """Answer ``GetAccount`` on `client` (a before-call hook) with these values, or
    with `error` = (code, message, HTTP status). Returns a function that removes the hook.
    Every call is counted in the returned function's ``calls`` list."""
    calls: list[float] = []

    def hook(**_: Any) -> Any:
        calls.append(time.monotonic())
        if error is not None:
            return _error(*error)
        return _HookResponse(200), {
            "SendingEnabled": sending_enabled, "EnforcementStatus": enforcement_status,
            "ProductionAccessEnabled": True,
            "SendQuota": {"Max24HourSend": max_24_hour_send, "MaxSendRate": max_send_rate,
                          "SentLast24Hours": sent_last_24_hours},
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }

    client.meta.events.register("before-call.sesv2.GetAccount", hook)

    def remove() -> None:
        client.meta.events.unregister("before-call.sesv2.GetAccount", hook)

    remove.calls = calls  # type: ignore[attr-defined]
    return remove




def fail_send_email(client: Any, choose: Callable[[dict[str, Any]], Any]) -> Callable[[], None]:
    """Make chosen ``SendEmail`` calls on `client` fail (a before-call hook).

    `choose(request)` gets the request as sent (the JSON body: ``FromEmailAddress``,
    ``Destination``, ``Content``, ``EmailTags``…) and returns None, an SES error
    ``(code, message, status)``, or an exception instance to raise (e.g.
    ``botocore.exceptions.EndpointConnectionError(endpoint_url=…)``). Thread-safe
    as long as `choose` is. Returns a function that removes the hook.
    """

    def hook(params: dict[str, Any], **_: Any) -> Any:
        body = params.get("body") or b"{}"
        request = json.loads(body.decode("utf-8") if isinstance(body, bytes) else body)
        fault = choose(request)
        if fault is None:
            return None
        if isinstance(fault, BaseException):
            raise fault
        return _error(*fault)

    client.meta.events.register("before-call.sesv2.SendEmail", hook)

    def remove() -> None:
        client.meta.events.unregister("before-call.sesv2.SendEmail", hook)

    return remove


def main(argv: list[str] | None = None) -> int:
    """``python -m outbox_tools.local_ses``: run a local SES (moto) until Ctrl-C."""
    ap = argparse.ArgumentParser(prog="python -m outbox_tools.local_ses",
                                 description="moto server with SES v2 GetAccount, for local relay runs")
    ap.add_argument("--host", default="127.0.0.1", help="interface (0.0.0.0 for sam local invoke in Docker)")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--max-send-rate", type=float, default=50.0)
    ap.add_argument("--verify", action="append", default=[], metavar="IDENTITY",
                    help="email or domain identity to verify at start (repeatable)")
    args = ap.parse_args(argv)
    try:
        import moto.server  # noqa: F401
    except ImportError:
        # moto is no dependency of the library: only the `local` extra (and `dev`) installs it
        ap.exit(1, f"{ap.prog}: error: moto is not installed; install the local extra: "
                   "pip install 'outbox-relay[local]'\n")
    server = LocalSesServer(args.port, host=args.host, max_send_rate=args.max_send_rate).start()
    if args.verify:
        server.verify(*args.verify)
    print(f"local SES (moto) at {server.url}; export AWS_ENDPOINT_URL_SESV2={server.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
