"""The real relay handler on events/relay-ses-scheduler.json, reaching a local SES
(moto in server mode, `outbox_tools.local_ses`) through the AWS endpoint override
variables, the way `sam local invoke` runs it with infra/sam-env.json."""

from __future__ import annotations

import email
import json
import os
import subprocess
import sys
from email import policy as email_policy

import pytest
from sqlalchemy import text

from outbox_relay import runtime
from outbox_relay.errors import ConfigurationError
from outbox_relay.producer import enqueue_email
from outbox_tools.lambda_local import LocalContext, load_handler, project_root
from outbox_tools.local_ses import LocalSesServer

ROOT = project_root()
EVENT = ROOT / "events" / "relay-ses-scheduler.json"
SUMMARY_KEYS = {"channel", "claimed", "delivered", "retried", "dead", "released", "lease_lost"}


def sam_env() -> dict[str, str]:
    """What `sam local invoke RelaySesFunction --env-vars infra/sam-env.json` sets."""
    data = json.loads((ROOT / "infra" / "sam-env.json").read_text(encoding="utf-8"))
    return {**data.get("Parameters", {}), **data.get("RelaySesFunction", {})}


@pytest.fixture
def local_ses():
    with LocalSesServer(max_send_rate=50) as server:
        yield server


def seed(app_engine) -> list:
    mails = [
        dict(to=["박지우 <jiwoo@example.com>"], subject="주문 확인 🎉", text="감사합니다 🙏"),
        dict(to=["zoe@example.com"], subject="Crème brûlée ✓", html="<p>Zoë — merci !</p>"),
        dict(to=["ana@example.com"], subject="Recibo ☕", text="adjunto", attachments=[("recibo.txt", b"3 x caf\xc3\xa9")]),
    ]
    with app_engine.begin() as conn:
        return [enqueue_email(conn, **m) for m in mails]


def printed_summary(stdout: str) -> dict:
    """The summary `outbox relay` prints (stdout also carries JSON log lines and EMF blobs)."""
    decoder = json.JSONDecoder()
    found = []
    for i, ch in enumerate(stdout):
        if ch == "{" and (i == 0 or stdout[i - 1] == "\n"):
            try:
                value, _ = decoder.raw_decode(stdout, i)
            except ValueError:
                continue
            if isinstance(value, dict) and "claimed" in value and "_aws" not in value and "level" not in value:
                found.append(value)
    assert found, stdout[-2000:]
    return found[-1]


def delivered_refs(app_engine) -> dict:
    with app_engine.connect() as conn:
        return {r.message_id: (r.status, r.delivery_ref) for r in conn.execute(text(
            "SELECT message_id, status, delivery_ref FROM outbox_message ORDER BY seq"))}


@pytest.mark.slow  # a process of its own
def test_handler_process_configured_like_sam_local_invoke_reaches_moto(local_ses, database_url, app_engine):
    # Given the sender identity of infra/sam-env.json verified in a local SES, and three emails
    env = sam_env()
    sender = env["OUTBOX_SES_FROM"]
    local_ses.verify(sender.rsplit("<", 1)[-1].rstrip(">"))
    ids = seed(app_engine)

    # When the handler runs once in its own process with that environment, pointed at the
    # local SES by AWS_ENDPOINT_URL and at this test's database (the only two values changed)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "POWERTOOLS_", "AWS_"))}
    full_env.update(env)
    full_env.update({"DATABASE_URL": database_url, "AWS_ENDPOINT_URL": local_ses.url, "OUTBOX_CHANNEL": "ses",
                     "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                     "POWERTOOLS_TRACE_DISABLED": "true",
                     "POWERTOOLS_LOG_LEVEL": "WARNING"})
    proc = subprocess.run([sys.executable, "-m", "outbox_tools.cli", "relay", "--event", str(EVENT)],
                          capture_output=True, text=True, env=full_env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = printed_summary(proc.stdout)

    # Then its summary reports three deliveries on the ses channel
    assert SUMMARY_KEYS <= set(summary)
    assert (summary["channel"], summary["claimed"], summary["delivered"], summary["dead"]) == ("ses", 3, 3, 0)

    # And moto recorded the three sends whose MessageIds the rows hold as delivery_ref
    sent = local_ses.sent_messages()
    refs = delivered_refs(app_engine)
    assert {refs[i][0] for i in ids} == {"delivered"}
    assert sorted(m.id for m in sent) == sorted(refs[i][1] for i in ids)
    subjects = sorted(m.subject if hasattr(m, "subject") else
                      str(email.message_from_string(m.raw_data, policy=email_policy.default)["Subject"])
                      for m in sent)
    assert subjects == sorted(["주문 확인 🎉", "Crème brûlée ✓", "Recibo ☕"])


@pytest.fixture
def ses_env(local_ses, relay_env, monkeypatch):
    """The SES relay's environment, AWS_ENDPOINT_URL_SESV2 pointing at the local SES."""
    monkeypatch.setenv("OUTBOX_CHANNEL", "ses")
    monkeypatch.setenv("OUTBOX_SES_FROM", "Shop <noreply@shop.example>")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", local_ses.url)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    runtime.reset()


def test_handler_in_process_with_the_sesv2_endpoint_variable(local_ses, ses_env, app_engine):
    # Given the SES relay's environment, with AWS_ENDPOINT_URL_SESV2 pointing at the local SES
    local_ses.verify("noreply@shop.example")
    ids = seed(app_engine)
    handler = load_handler("relay")
    sample = json.loads(EVENT.read_text())

    # When the handler runs on the sample event, twice
    first = handler(sample, LocalContext(30))
    second = handler(sample, LocalContext(30))

    # Then the first invocation delivers everything and the second finds nothing to do
    assert (first["channel"], first["delivered"], first["skipped"]) == ("ses", 3, None)
    assert (second["claimed"], second["delivered"]) == (0, 0)
    assert {v[0] for v in delivered_refs(app_engine).values()} == {"delivered"}
    assert len(local_ses.sent_messages()) == 3 and len(ids) == 3

    # And a schedule meant for the Redis relay is refused by this function
    with pytest.raises(ConfigurationError) as err:
        handler(dict(sample, channel="redis"), LocalContext(30))
    assert err.value.variable == "OUTBOX_CHANNEL"


def test_configured_sender_refused_stops_the_batch_and_emits_the_metric(local_ses, ses_env, app_engine, capsys):
    # Given emails from the configured sender, an identity the local SES has not verified
    seed(app_engine)
    handler = load_handler("relay")

    # When the handler runs on the sample event
    summary = handler(json.loads(EVENT.read_text()), LocalContext(30))

    # Then the batch is stopped, everything released with attempts refunded, nothing sent
    assert (summary["stopped"], summary["claimed"], summary["released"], summary["delivered"]) == \
        ("stop_batch", 3, 3, 0)
    with app_engine.connect() as conn:
        states = {tuple(r) for r in conn.execute(text(
            "SELECT status, attempts, last_error_class FROM outbox_message"))}
    assert states == {("pending", 0, "configuration")}
    assert local_ses.sent_messages() == []

    # And the invocation's EMF metrics say the batch was stopped
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{") and '"_aws"' in line]
    stopped = [b["BatchStopped"] for b in blobs if "BatchStopped" in b]
    assert stopped and sum(v if isinstance(v, (int, float)) else sum(v) for v in stopped) == 1
