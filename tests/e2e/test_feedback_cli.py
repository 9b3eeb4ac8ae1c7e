"""`outbox show`, `outbox suppression list|add|remove` and the feedback counts of
`outbox stats`, as an operator runs them, on a message the relay sent and the
feedback function heard about."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from outbox_relay.feedback import run as feedback_run
from outbox_relay.feedback.hashing import AddressHasher
from outbox_tools.cli import main
from outbox_tools.lambda_local import LocalContext, load_handler
from support.feedback import ADDRESS_KEY, event_for


@pytest.fixture
def outbox(database_url):
    def _run(*args: str, key: bool = True):
        env = {"DATABASE_URL": database_url, "OUTBOX_SES_ADDRESS_KEY": ADDRESS_KEY if key else ""}
        return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return _run


@pytest.fixture
def told(monkeypatch, database_url, app_engine):
    """A delivered email (SES id ses-1) with a Delivery and a permanent Bounce recorded by the feedback function."""
    mid = uuid.uuid4()
    with app_engine.begin() as conn:
        from outbox_relay.producer import enqueue_email

        enqueue_email(conn, to=["jiwoo@example.net"], subject="s", text="t", message_id=mid)
        conn.execute(text("UPDATE outbox_message SET status = 'delivered', attempts = 1, delivered_at = now(), "
                          "delivery_ref = 'ses-1'"))
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("OUTBOX_SES_ADDRESS_KEY", ADDRESS_KEY)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    feedback_run.reset()
    handler = load_handler("feedback")
    for kind in ("delivery", "bounce"):
        handler(event_for(kind, outbox_id=str(mid), ses_id="ses-1", recipient="jiwoo@example.net"), LocalContext(30))
    feedback_run.reset()
    return mid


def test_show_tells_a_messages_whole_story_without_an_address(outbox, told):
    result = outbox("show", str(told), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["status"], data["attempts"], data["delivery_ref"]) == ("delivered", 1, "ses-1")
    assert [(e["event_type"], e["subtype"], e["recipients"]) for e in data["events"]] == [
        ("delivery", None, 1), ("bounce", "Permanent/General", 1)]
    human = outbox("show", str(told)).output
    assert "bounce" in human and "Permanent/General" in human and "ses-1" in human
    assert "@" not in result.output + human


def test_show_refuses_what_is_not_a_message_id(outbox):
    result = CliRunner().invoke(main, ["show", "nope"])
    assert result.exit_code == 2 and "MESSAGE_ID" in result.output


def test_stats_counts_bounced_complained_suppressed_and_ambiguous(outbox, told, app_engine):
    with app_engine.begin() as conn:
        from outbox_relay.producer import enqueue_email

        for to in ("a@example.net", "b@example.net"):
            enqueue_email(conn, to=[to], subject="s", text="t")
        conn.execute(text("UPDATE outbox_message SET status = 'dead', dead_at = now(), "
                          "last_error_class = 'suppressed' WHERE seq = 2"))
        conn.execute(text("UPDATE outbox_message SET attempts = 1, last_error_class = 'ambiguous', "
                          "available_at = now() + interval '10 minutes' WHERE seq = 3"))
        from outbox_relay.producer import enqueue_event

        enqueue_event(conn, stream="orders", type="order.placed", payload={"n": 1})
    data = json.loads(outbox("stats", "--json").output)
    redis, ses = data["channels"]
    assert {k: ses[k] for k in ("delivered", "bounced", "complained", "suppressed", "ambiguous")} == {
        "delivered": 1, "bounced": 1, "complained": 0, "suppressed": 1, "ambiguous": 1}
    # the email table holds the email channel's row alone: no redis row, no total
    human = outbox("stats").output
    feedback = human[human.index("email feedback"):]
    assert [li.split()[1] for li in feedback.splitlines() if li.startswith("│")] == ["ses"]


def test_suppression_add_list_remove(outbox, told):
    digest = AddressHasher(ADDRESS_KEY).hash("zoe@example.net")
    added = outbox("suppression", "add", "Zoë <Zoe@Example.net>", "--note", "asked by support")
    assert added.exit_code == 0 and added.output.strip() == f"added: {digest[:16]}…"
    assert outbox("suppression", "add", "zoe@example.net").output.startswith("already on the list")
    listed = json.loads(outbox("suppression", "list", "--json").output)
    assert list(listed) == ["suppressed"]
    assert {(e["address_hash"], e["reason"]) for e in listed["suppressed"]} == {
        (digest, "manual"), (AddressHasher(ADDRESS_KEY).hash("jiwoo@example.net"), "bounce")}
    assert "@" not in outbox("suppression", "list").output
    assert outbox("suppression", "remove", "zoe@example.net").output.startswith("removed (manual)")
    gone = outbox("suppression", "remove", "zoe@example.net")
    assert gone.exit_code == 1 and "not on the list" in gone.output


@pytest.mark.parametrize(("args", "says"), [
    (("suppression", "add", "not an address"), "ADDRESS"),
    (("suppression", "add", "a@example.net", "--note", "x" * 201), "--note"),
    (("suppression", "remove", "a@@example.net"), "ADDRESS"),
    (("suppression", "list", "--limit", "0"), "--limit"),
])
def test_bad_arguments_are_named_in_one_line(outbox, args, says, app_engine):
    result = outbox(*args)
    assert result.exit_code == 2 and says in result.output
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_suppression")).scalar() == 0


def test_without_the_key_suppression_add_names_the_variable(outbox):
    result = outbox("suppression", "add", "a@example.net", key=False)
    assert result.exit_code == 1 and "OUTBOX_SES_ADDRESS_KEY" in result.output


def test_a_sample_event_that_matches_no_message_says_how_to_make_it_match(database_url, app_engine, monkeypatch):
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    env = {"DATABASE_URL": database_url, "OUTBOX_SES_ADDRESS_KEY": ADDRESS_KEY}

    def relay_the_sample():
        feedback_run.reset()
        try:
            runner = CliRunner(mix_stderr=False)  # click 8.1
        except TypeError:  # click 8.2 keeps standard error apart and dropped the argument
            runner = CliRunner()
        done = runner.invoke(main, ["relay", "--function", "feedback", "--event",
                                         "events/feedback-bounce.json"], env=env, catch_exceptions=False)
        feedback_run.reset()
        assert done.exit_code == 0, done.output
        return json.loads(done.stdout), done.stderr

    # Given the bounce sample of events/ and a database without its message
    summary, err = relay_the_sample()
    # Then the summary counts it unknown, and one line says how to make it match
    assert (summary["unknown"], summary["recorded"]) == (1, 0)
    [hint] = [line for line in err.splitlines() if line.startswith("outbox relay:")]
    command = hint.rsplit(": ", 1)[1]
    assert command.startswith("outbox enqueue-email --message-id 0b6e4a52-9c1d-4f3e-8a7b-2d5c6e7f8091 ")
    # When the user does so, the same sample is recorded against that message
    enqueued = CliRunner().invoke(main, ["enqueue-email", "--message-id", command.split()[3], "--to",
                                         "bounce@simulator.amazonses.com", "--subject", "s", "--text", "t"], env=env)
    assert enqueued.exit_code == 0, enqueued.output
    summary, err = relay_the_sample()
    assert (summary["unknown"], summary["recorded"]) == (0, 1) and "outbox relay:" not in err
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_email_event")).scalar_one() == 1
