"""SES channel: achieved sends per second against the account's MaxSendRate.

Amazon SES is played by moto, in process (`mock_aws`). moto has no SES v2
GetAccount, so a botocore before-call hook answers it with MaxSendRate 50
(`outbox_tools.local_ses.answer_get_account`), and a second hook makes every
SendEmail take 50 ms before moto records it (a simulated call latency). The
relay is the real handler with OUTBOX_CHANNEL=ses, run back to back until the
backlog is drained. The rate is measured from the start times of the sends:
(sends − 1) / (last start − first start); the busiest one-second window must
not hold more than MaxSendRate sends.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from typing import Any

from .env import BenchEnv
from .handler import relay

SENDER = "noreply@bench.example"
REGION = "us-east-1"


def _enqueue_mail(env: BenchEnv, n: int) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from outbox_relay.producer import enqueue_email

    engine = create_engine(env.database_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for i in range(n):
                enqueue_email(conn, to=f"customer{i}@example.com", subject=f"Your order SO-{i:08d} has shipped",
                              text=f"Hello,\n\nyour order SO-{i:08d} is on its way.\n",
                              html=f"<p>Hello,</p><p>your order <b>SO-{i:08d}</b> is on its way.</p>")
    finally:
        engine.dispose()


def run_ses(env: BenchEnv, *, n: int, max_send_rate: float = 50.0, latency_ms: float = 50.0,
            batch_size: int = 500) -> dict[str, Any]:
    """Deliver `n` emails through moto and report the achieved send rate."""
    from moto import mock_aws
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ses.models import ses_backends

    from outbox_tools.local_ses import answer_get_account

    starts: list[float] = []
    lock = threading.Lock()

    def slow_send(**_: Any) -> None:
        with lock:
            starts.append(time.monotonic())
        time.sleep(latency_ms / 1000.0)
        return None  # moto then handles (and records) the call

    def prepare(deps: Any) -> None:
        client = deps.publisher.client
        client.create_email_identity(EmailIdentity=SENDER)
        answer_get_account(client, max_send_rate=max_send_rate)
        client.meta.events.register("before-call.sesv2.SendEmail", slow_send)

    aws = {k: None for k in os.environ if k.startswith("AWS_ENDPOINT_URL") or k in ("AWS_PROFILE",)}
    aws.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": None,
                "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "OUTBOX_SES_FROM": f"Bench <{SENDER}>"})
    env.reset_table()
    with mock_aws():
        with relay(env, batch_size, channel="ses", extra_env=aws, prepare=prepare) as r:
            _enqueue_mail(env, n)
            starts.clear()
            invocations = delivered = 0
            started = time.perf_counter()
            while True:
                result = r.invoke()
                invocations += 1
                delivered += result["delivered"]
                if result["claimed"] == 0:
                    break
            wall = time.perf_counter() - started
        recorded = len(ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages)
    counts = env.counts()
    env.reset_table()
    starts.sort()
    rate = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else 0.0
    busiest = max((bisect.bisect_left(starts, t + 1.0) - i for i, t in enumerate(starts)), default=0)
    return {
        "messages": n,
        "max_send_rate": max_send_rate,
        "latency_ms": latency_ms,
        "batch_size": batch_size,
        "sends": len(starts),
        "sends_per_second": round(rate, 2),
        "fraction_of_max_send_rate": round(rate / max_send_rate, 3),
        "busiest_second": busiest,
        "wall_seconds": round(wall, 2),
        "messages_per_second_wall": round(delivered / wall, 2) if wall else None,
        "invocations": invocations,
        "delivered": delivered,
        "check": {"moto_recorded": recorded, "rows_delivered": counts.get("delivered", 0),
                  "ok": recorded == n == delivered == counts.get("delivered", 0) and busiest <= max_send_rate},
    }
