"""One stored email the `email` package cannot write never jams the SES channel: it is
dead-lettered naming the field, and the good emails around it are sent exactly once."""

from __future__ import annotations

import re
import threading

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from outbox_relay.loop import RelayLoop
from outbox_relay.models import ClaimedMessage
from outbox_relay.publishers.base import Deadline
from outbox_tools.cli import main
from support.rows import insert_rows
from support.ses import make_publisher, sent_messages

#: The reviewer's row: valid JSON and valid fields, but the stdlib parser raises IndexError on the
#: Resent-To value while building the MIME (the attachment sends it as raw MIME).
BAD_ROW = insert_rows("""SELECT gen_random_uuid() AS message_id, 'ses' AS channel, 'ses' AS destination,
'email' AS type, '{"to":["p@example.com"],"subject":"s","text":"t",
"headers":{"Resent-To":"a@"},"attachments":[{"filename":"a.txt","content_type":"text/plain",
"content_base64":"eA=="}]}' AS payload""", ["channel", "destination", "type"])


def _recipients() -> list[str]:
    return [d for m in sent_messages() for d in m.destinations.get("ToAddresses", [])]


def test_a_bad_stored_email_is_dead_lettered_and_the_good_ones_sent_once(ses, ses_store, enqueue_mail, policy,
                                                                           plenty, rows, app_engine):
    # Given three good emails, then one inserted by hand whose header cannot be written as MIME
    enqueue_mail(3)
    with app_engine.begin() as conn:
        conn.execute(BAD_ROW)

    # When the SES relay runs three times
    summaries = [RelayLoop(ses_store, make_publisher(ses), policy, plenty, f"owner-{i}").run() for i in range(3)]

    # Then no run raised, and each good email was sent exactly once (moto's record)
    assert sorted(_recipients()) == ["user0@example.com", "user1@example.com", "user2@example.com"]
    assert [s.stopped for s in summaries] == [None, None, None]

    # And the good rows are delivered, the bad one dead at once with an error naming the field only
    states = [(r["status"], r["attempts"], r["last_error_class"]) for r in rows()]
    assert states == [("delivered", 1, None)] * 3 + [("dead", 1, "permanent")]
    bad = rows()[3]
    assert bad["last_error"].startswith("ses: headers: ")
    assert "a@" not in bad["last_error"] and "p@example.com" not in bad["last_error"]


def test_a_stored_email_over_the_ses_size_is_dead_lettered_at_send_naming_the_field(ses, ses_store, enqueue_mail,
                                                                                  policy, plenty, rows, app_engine):
    # Given a good email, then one written by hand whose attachment (30,000,000 zero bytes, made in
    # PostgreSQL) is more than 40,000,000 bytes once the MIME message base64-encodes it
    enqueue_mail(1)
    with app_engine.begin() as conn:
        conn.execute(insert_rows("""SELECT gen_random_uuid() AS message_id, 'ses' AS channel, 'ses' AS destination,
            'email' AS type, json_build_object('to', json_build_array('big@example.com'), 'subject', 's',
            'text', 't', 'attachments', json_build_array(json_build_object('filename', 'big.bin',
            'content_type', 'application/octet-stream', 'content_base64', repeat('A', 40000000)))) AS payload""",
                                 ["channel", "destination", "type"]))

    # When the SES relay runs
    summary = RelayLoop(ses_store, make_publisher(ses), policy, plenty, "owner-1").run()

    # Then the good one is sent, and the big one is dead at once, measured on the real message,
    # its error naming the field and the size, never sent to SES
    assert (summary.delivered, summary.dead, summary.stopped) == (1, 1, None)
    assert _recipients() == ["user0@example.com"]
    big = rows()[1]
    assert (big["status"], big["attempts"], big["last_error_class"]) == ("dead", 1, "permanent")
    size = int(re.search(r"the message is (\d+) bytes as MIME", big["last_error"]).group(1))
    assert big["last_error"].startswith("ses: attachments: ") and size > 40_000_000


def test_an_unexpected_error_preparing_one_email_retries_it_and_sends_the_rest(ses, ses_store, enqueue_mail,
                                                                               policy, plenty, rows, monkeypatch):
    # Given three emails, and a bug of ours that raises while preparing the second
    ids = enqueue_mail(3)
    publisher = make_publisher(ses, record_group_size=1)
    real = publisher.prepare

    def prepare(m: ClaimedMessage):
        if m.message_id == str(ids[1]):
            raise RuntimeError("a bug")
        return real(m)

    monkeypatch.setattr(publisher, "prepare", prepare)

    # When one invocation runs
    summary = RelayLoop(ses_store, publisher, policy, plenty, "owner-1").run()

    # Then the others are delivered, and the second is retried with backoff (transient), not dead
    assert summary.stopped is None
    assert sorted(_recipients()) == ["user0@example.com", "user2@example.com"]
    states = [(r["status"], r["attempts"], r["last_error_class"]) for r in rows()]
    assert states == [("delivered", 1, None), ("pending", 1, "transient"), ("delivered", 1, None)]
    assert "RuntimeError" in rows()[1]["last_error"] and not rows()[1]["due"]


def test_sends_completed_before_an_exception_are_recorded(ses, ses_store, enqueue_mail, policy, rows,
                                                         monkeypatch):
    # Given three emails sent one at a time, and a deadline clock that breaks on the relay's own
    # thread after the first send completed (its result waiting for its record group)
    enqueue_mail(3)
    publisher = make_publisher(ses, max_concurrency=1, record_group_size=100)
    prepared = []
    real = publisher.prepare
    monkeypatch.setattr(publisher, "prepare", lambda m: prepared.append(m.seq) or real(m))

    def remaining_ms() -> int:
        if len(prepared) >= 2 and threading.current_thread() is threading.main_thread():
            raise OSError("clock gone")
        return 60_000

    # When the batch fails part way through (the exception is the relay's to handle)
    with pytest.raises(OSError):
        RelayLoop(ses_store, publisher, policy, Deadline(remaining_ms, margin_seconds=5), "owner-1").run()

    # Then what SES accepted is recorded as delivered before the exception got out (it would not
    # be sent again after the lease expires), and nothing more was started once it was raised
    assert _recipients() == ["user0@example.com"]
    assert [r["status"] for r in rows()][0] == "delivered"


def test_cli_refuses_a_header_it_cannot_write_naming_the_field(database_url, app_engine):
    # When the command is given an address header whose value makes the stdlib parser raise IndexError
    result = CliRunner().invoke(main, ["enqueue-email", "--to", "b@example.com", "--subject", "s", "--text", "t",
                                       "--header", "Resent-To: a@"],
                                env={"DATABASE_URL": database_url}, catch_exceptions=False)

    # Then it is a usage error naming the field, not a traceback, and nothing is written
    assert result.exit_code == 2, result.output
    assert "invalid email: headers: Resent-To" in result.output and "Traceback" not in result.output
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_message")).scalar_one() == 0
