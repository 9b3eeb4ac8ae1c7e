"""SES feedback: events recorded per second, and the send path's cost with the
suppression list on, as a ratio to off in the same run.

- **Recording.** `n` emails are written as delivered (each with its SES message
  id), then one SES event per message (the samples of events/ addressed to it:
  nine Deliveries for one permanent Bounce) goes through the real feedback
  handler (functions/feedback/app.py), one SNS event per invocation as SNS
  invokes it, back to back. events/s = events / wall time of that loop. Then
  every tenth event again: each must be a duplicate, changing nothing.
- **Send path.** The real SES relay handler on moto (in process, no simulated
  call latency, MaxSendRate high enough not to pace) drains `sends` emails with
  the suppression list off and on, in rounds that alternate which goes first
  (the median of each is kept); with it on, the list holds `suppressed` addresses, none of them a
  recipient, so both runs send everything and the difference is the check
  itself (loading the payloads, hashing every recipient, one statement a batch).
  The ratios are on / off, in wall time per email and in this process's CPU
  time per email (moto runs in it too; the host's other load moves it less).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from .env import BenchEnv
from .handler import _Discard, relay

SENDER = "noreply@bench.example"
REGION = "us-east-1"
KEY = "bench-address-key-" + "0" * 32


def _events(message_ids: list[str]) -> list[dict[str, Any]]:
    from outbox_tools.lambda_local import project_root

    root = project_root() / "events"
    samples = {t: json.loads((root / f"feedback-{t}.json").read_text()) for t in ("delivery", "bounce")}
    out = []
    for i, mid in enumerate(message_ids):
        kind = "bounce" if i % 10 == 9 else "delivery"
        event = json.loads(json.dumps(samples[kind]))
        message = json.loads(event["Records"][0]["Sns"]["Message"])
        message["mail"]["messageId"] = f"bench-ses-{i}"
        message["mail"]["tags"]["outbox-message-id"] = [mid]
        if kind == "bounce":
            message["bounce"]["feedbackId"] = f"bench-feedback-{i}"
            message["bounce"]["bouncedRecipients"][0]["emailAddress"] = f"customer{i}@example.com"
        event["Records"][0]["Sns"]["Message"] = json.dumps(message)
        out.append(event)
    return out


def _delivered_messages(env: BenchEnv, n: int) -> list[str]:
    from sqlalchemy import text

    from .ses import _enqueue_mail

    _enqueue_mail(env, n)
    with env.engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET status = 'delivered', attempts = 1, delivered_at = now(), "
                          "delivery_ref = 'bench-ses-' || (seq - 1)"))
        return [str(r[0]) for r in conn.execute(text("SELECT message_id FROM outbox_message ORDER BY seq"))]


def _table_counts(env: BenchEnv) -> tuple[int, int]:
    from sqlalchemy import text

    with env.engine.connect() as conn:
        return (conn.execute(text("SELECT count(*) FROM outbox_email_event")).scalar_one(),
                conn.execute(text("SELECT count(*) FROM outbox_suppression")).scalar_one())


def _empty_feedback(env: BenchEnv) -> None:
    from sqlalchemy import text

    with env.engine.begin() as conn:
        conn.execute(text("TRUNCATE outbox_email_event, outbox_suppression"))


def run_recording(env: BenchEnv, n: int) -> dict[str, Any]:
    import contextlib

    from outbox_relay import observability as obs
    from outbox_relay.feedback import run as feedback_run
    from outbox_tools.lambda_local import LocalContext, environment, load_handler

    env.reset_table()
    _empty_feedback(env)
    events = _events(_delivered_messages(env, n))
    sink = _Discard()
    variables = {k: None for k in os.environ if k.startswith("OUTBOX_")}
    variables.update({"DATABASE_URL": env.database_url, "DATABASE_SECRET_ARN": None, "OUTBOX_SES_ADDRESS_KEY": KEY,
                      "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_NAMESPACE": "OutboxRelayBench"})
    with environment(**variables):
        feedback_run.reset()
        handler = load_handler("feedback")
        previous = obs.logger.registered_handler.setStream(sink)
        try:
            with contextlib.redirect_stdout(sink):
                handler(events[0], LocalContext(30, function_name="outbox-feedback-bench"))  # the cold start
                started = time.perf_counter()
                recorded = 1
                for event in events[1:]:
                    recorded += handler(event, LocalContext(30, function_name="outbox-feedback-bench"))["recorded"]
                wall = time.perf_counter() - started
                before = _table_counts(env)
                again = [handler(e, LocalContext(30, function_name="outbox-feedback-bench"))
                         for e in events[::10]]
                after = _table_counts(env)
        finally:
            obs.logger.registered_handler.setStream(previous)
            feedback_run.reset()
    env.reset_table()
    _empty_feedback(env)
    duplicates = sum(a["duplicates"] for a in again)
    return {
        "events": n,
        "events_per_second": round((n - 1) / wall, 1) if wall else None,
        "wall_seconds": round(wall, 2),
        "redelivered": len(again),
        "check": {"recorded": recorded, "events_rows": before[0], "suppressed_rows": before[1],
                  "duplicates": duplicates,
                  "ok": recorded == before[0] == n and before[1] == n // 10 and duplicates == len(again)
                  and after == before},
    }


def _drain_ses(env: BenchEnv, sends: int, batch_size: int, suppression: bool, listed: int) -> dict[str, Any]:
    from moto import mock_aws
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ses.models import ses_backends
    from sqlalchemy import text

    from outbox_relay.feedback.hashing import AddressHasher
    from outbox_tools.local_ses import answer_get_account

    def prepare(deps: Any) -> None:
        client = deps.publisher.client
        client.create_email_identity(EmailIdentity=SENDER)
        answer_get_account(client, max_send_rate=100_000.0, max_24_hour_send=-1)

    env.reset_table()
    _empty_feedback(env)
    if listed:
        hasher = AddressHasher(KEY)
        with env.engine.begin() as conn:
            conn.execute(text("INSERT INTO outbox_suppression (address_hash, reason) "
                              "SELECT unnest(CAST(:h AS text[])), 'manual'"),
                         {"h": "{" + ",".join(hasher.hash(f"listed{i}@example.org") for i in range(listed)) + "}"})
    aws = {k: None for k in os.environ if k.startswith("AWS_ENDPOINT_URL") or k in ("AWS_PROFILE",)}
    aws.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": None,
                "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "OUTBOX_SES_FROM": f"Bench <{SENDER}>",
                "OUTBOX_SES_MAX_CONCURRENCY": "8", "OUTBOX_SES_SUPPRESSION": "true" if suppression else "false",
                "OUTBOX_SES_ADDRESS_KEY": KEY})
    with mock_aws():
        with relay(env, batch_size, channel="ses", extra_env=aws, prepare=prepare) as r:
            from .ses import _enqueue_mail

            _enqueue_mail(env, sends)
            env.vacuum_analyze()
            started, cpu = time.perf_counter(), time.process_time()
            delivered = 0
            while True:
                result = r.invoke()
                delivered += result["delivered"]
                if result["claimed"] == 0:
                    break
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        recorded = len(ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages)
    env.reset_table()
    _empty_feedback(env)
    return {"wall_seconds": wall, "cpu_seconds": cpu, "delivered": delivered, "moto_recorded": recorded}


def run_send_path(env: BenchEnv, sends: int, *, batch_size: int = 500, listed: int = 10_000,
                  rounds: int = 4) -> dict[str, Any]:
    off, on, off_cpu, on_cpu = [], [], [], []
    ok = True
    _drain_ses(env, min(sends, 100), batch_size, False, 0)  # warm-up: imports, moto's backends, plans
    for i in range(rounds):
        # ABBA: which goes first alternates, so a drift of the host's load favours neither.
        order = ((False, off, off_cpu), (True, on, on_cpu))
        for suppression, into, into_cpu in (order if i % 2 == 0 else order[::-1]):
            r = _drain_ses(env, sends, batch_size, suppression, listed if suppression else 0)
            ok = ok and r["delivered"] == sends == r["moto_recorded"]
            into.append(r["wall_seconds"] / sends * 1e6)
            into_cpu.append(r["cpu_seconds"] / sends * 1e6)
    off_us, on_us = statistics.median(off), statistics.median(on)
    off_cpu_us, on_cpu_us = statistics.median(off_cpu), statistics.median(on_cpu)
    return {
        "sends": sends, "batch_size": batch_size, "listed_addresses": listed, "rounds": rounds,
        "us_per_email_off": round(off_us, 1), "us_per_email_on": round(on_us, 1),
        "ratio_on_to_off": round(on_us / off_us, 3),
        "cpu_us_per_email_off": round(off_cpu_us, 1), "cpu_us_per_email_on": round(on_cpu_us, 1),
        "cpu_ratio_on_to_off": round(on_cpu_us / off_cpu_us, 3),
        "wall_us_per_email_each_round": {"off": [round(x, 1) for x in off], "on": [round(x, 1) for x in on]},
        "check": {"ok": ok},
    }


def run_feedback(env: BenchEnv, *, events: int, sends: int, rounds: int) -> dict[str, Any]:
    recording = run_recording(env, events)
    send_path = run_send_path(env, sends, rounds=rounds)
    return {"recording": recording, "send_path": send_path,
            "check": {"ok": recording["check"]["ok"] and send_path["check"]["ok"]}}
