"""A SendEmail that hangs ends within the SES client's timeouts, which fit inside the
deadline margin: the attempt is TRANSIENT and recorded before the Lambda deadline."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import pytest

from outbox_relay.loop import RelayLoop
from outbox_relay.publishers.aws_client import create_client
from outbox_relay.publishers.base import Deadline
from support.ses import make_publisher


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An HTTP endpoint on 127.0.0.1 that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_hanging_send_times_out_transient_and_is_recorded_before_the_deadline(
        aws_env, monkeypatch, silent_endpoint, ses_store, enqueue_mail, policy, rows):
    # Given an SES endpoint that never answers, and the smallest margin the SES relay accepts
    monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", silent_endpoint)
    margin = 4.0
    client = create_client("sesv2", "SES", max_concurrency=2, deadline_margin_seconds=margin)
    assert (client.meta.config.connect_timeout, client.meta.config.read_timeout) == (2.0, 1.0)
    enqueue_mail(1)

    # When an invocation with half a second to spare before the margin sends the email
    start = time.monotonic()
    budget = margin + 0.5  # seconds the Lambda has left
    deadline = Deadline(lambda: int((start + budget - time.monotonic()) * 1000), margin_seconds=margin)
    summary = RelayLoop(ses_store, make_publisher(client), policy, deadline, "owner-1").run()
    took = time.monotonic() - start

    # Then the send timed out and its outcome was recorded well before the deadline
    assert took < budget - 1.0, took
    assert summary.stopped is None

    # And it is a transient failure: attempt counted, retried later with backoff, never dead
    [row] = rows()
    assert (row["status"], row["attempts"], row["last_error_class"]) == ("pending", 1, "transient")
    assert "ReadTimeoutError" in row["last_error"]
    assert not row["due"] and row["dead_at"] is None
