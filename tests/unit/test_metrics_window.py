"""The EMF documents a long invocation flushes while it runs (`MetricsWindow`)."""

from __future__ import annotations

import json
import warnings

from outbox_relay import observability as obs
from outbox_relay.invocation import MetricsWindow
from outbox_relay.publishers.registry import Channel
from outbox_relay.store import RecordResult
from outbox_relay.summary import Summary


def _values(blob: dict, name: str) -> list:
    value = blob.get(name, [])
    return value if isinstance(value, list) else [value]


def test_a_window_of_many_lags_flushes_every_metric_without_an_empty_flush(capsys) -> None:
    # Given a window whose messages' lags fill an EMF document's 100 values (Powertools then
    # flushes by itself as the 100th is added)
    now = [0.0]
    window = MetricsWindow(Channel.REDIS, 1.0, clock=lambda: now[0])
    summary = Summary(channel="redis", mode="latency", lease_owner="t")
    summary.add(RecordResult(delivered=150, lags_ms=tuple(range(150))))
    now[0] = 2.0
    try:
        # When the window is due: no "No application metrics to publish" warning (an error here)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            window.maybe_flush(summary)
    finally:
        obs.metrics.clear_metrics()
    # Then what was flushed carries the counts and the 100 lag values, once
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert sum(sum(_values(b, "Delivered")) for b in blobs) == 150
    assert len([v for b in blobs for v in _values(b, "DeliveryLag")]) == 100
