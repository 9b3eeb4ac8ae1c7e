"""Each SES error class, injected with a botocore before-call hook, ends in the right
state with the right attempts (docs/design.md, "Message lifecycle"; docs/channels.md, "Errors: whose fault, and what happens")."""

from __future__ import annotations

from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError
from sqlalchemy import text

from outbox_relay.backoff import Backoff
from outbox_relay.loop import RelayLoop, RelayPolicy
from outbox_tools.local_ses import fail_send_email
from support.ses import CONFIGURATION_SET, SENDER_IDENTITY, make_publisher, sent_messages

VICTIM = "victim@example.com"


def _fail_victim(client, fault):
    """Make the SendEmail call for VICTIM fail with `fault`; every other call goes to moto.
    Returns the function that removes the hook."""
    return fail_send_email(client, lambda r: fault if VICTIM in r["Destination"].get("ToAddresses", []) else None)


def _victim(case: str) -> str:
    return "victim-" + "".join(c if c.isalnum() else "-" for c in case) + "@example.com"


#: Deferrals far apart, so each class is recognisable by when the message is due again
#: however long the batch took: throttled 300 s, transient backoff 900-1000 s.
WIDE = RelayPolicy(batch_size=100, lease_seconds=30, backoff=Backoff(base=1000, cap=2000, floor=900),
                   throttle_delay_seconds=300)

# (fault, status, attempts, error class, due in (low, high) seconds or None, error text must contain)
MESSAGE_OUTCOMES = {
    "recipient rejected": (("MessageRejected", "Email address is not verified. The following identities failed "
                                               "the check in region US-EAST-1: {victim}", 400),
                           "dead", 1, "permanent", None, "MessageRejected"),
    "content rejected": (("MessageRejected", "Message content is not allowed: unsupported attachment type", 400),
                         "dead", 1, "permanent", None, "MessageRejected"),
    "bad request": (("BadRequestException", "Invalid header name", 400), "dead", 1, "permanent", None,
                    "BadRequestException"),
    "too many requests": (("TooManyRequestsException", "Too many requests", 429),
                          "pending", 0, "throttled", (250.0, 300.05), "TooManyRequestsException"),
    "limit exceeded": (("LimitExceededException", "Too many instances", 400),
                       "pending", 0, "throttled", (250.0, 300.05), "LimitExceededException"),
    "maximum sending rate": (("Throttling", "Maximum sending rate exceeded.", 400),
                             "pending", 0, "throttled", (250.0, 300.05), "Maximum sending rate exceeded"),
    "internal failure (500)": (("InternalFailure", "internal error", 500),
                               "pending", 1, "transient", (850.0, 1000.05), "InternalFailure"),
    "service unavailable (503)": (("ServiceUnavailable", "unavailable", 503),
                                  "pending", 1, "transient", (850.0, 1000.05), "ServiceUnavailable"),
    "connection refused": (EndpointConnectionError(endpoint_url="https://email.us-east-1.amazonaws.com"),
                           "pending", 1, "transient", (850.0, 1000.05), "EndpointConnectionError"),
    "read timeout": (ReadTimeoutError(endpoint_url="https://email.us-east-1.amazonaws.com"),
                     "pending", 1, "transient", (850.0, 1000.05), "ReadTimeoutError"),
    "connection reset": (ConnectionClosedError(endpoint_url="https://email.us-east-1.amazonaws.com"),
                         "pending", 1, "transient", (850.0, 1000.05), "ConnectionClosedError"),
}


def test_message_level_error_classes(ses, ses_store, enqueue_mail, plenty, rows):
    # Given one email per error class, each to a recipient whose send fails that way, among good ones
    cases = list(MESSAGE_OUTCOMES)
    victims = {_victim(c): c for c in cases}

    def fault_for(request):
        [to] = request["Destination"]["ToAddresses"]
        case = victims.get(to)
        if case is None:
            return None
        fault = MESSAGE_OUTCOMES[case][0]
        return fault if isinstance(fault, BaseException) else (fault[0], fault[1].format(victim=to), fault[2])

    fail_send_email(ses, fault_for)
    addresses = ["good-first@example.com", *victims, "good-last@example.com"]
    enqueue_mail(len(addresses), to=lambda i: [addresses[i]])

    # When one invocation runs
    summary = RelayLoop(ses_store, make_publisher(ses), WIDE, plenty, "owner-1").run()

    # Then the batch is not stopped and the good ones are delivered
    assert summary.stopped is None
    after = {r["payload"]["to"][0]: r for r in rows()}
    assert {(after[a]["status"], after[a]["attempts"]) for a in addresses if a.startswith("good")} \
        == {("delivered", 1)}
    assert summary.throttled == sum(1 for c in cases if MESSAGE_OUTCOMES[c][3] == "throttled")

    # And each failed one ends in the state its class calls for, with the right attempts and deferral
    for victim, case in victims.items():
        _, status, attempts, error_class, due_in, snippet = MESSAGE_OUTCOMES[case]
        row = after[victim]
        assert (row["status"], row["attempts"], row["last_error_class"]) == (status, attempts, error_class), case
        assert snippet in row["last_error"], case
        assert victim not in row["last_error"], case  # stored errors never echo addresses
        if due_in is None:
            assert row["dead_at"] is not None, case
        else:
            assert due_in[0] <= row["due_in"] <= due_in[1], (case, row["due_in"])


def test_daily_quota_defers_the_rest_of_the_batch_without_sending(ses, ses_store, enqueue_mail, policy, plenty,
                                                                  rows):
    # Given six emails and an SES that answers the second send with "Daily message quota exceeded"
    enqueue_mail(6, to=lambda i: [VICTIM] if i == 1 else [f"user{i}@example.com"])
    _fail_victim(ses, ("Throttling", "Daily message quota exceeded.", 400))

    # When one invocation sends one at a time
    summary = RelayLoop(ses_store, make_publisher(ses, max_concurrency=1, record_group_size=1), policy, plenty,
                        "owner-1").run()

    # Then the first is delivered and the rest are deferred by the quota deferral, attempts refunded, never dead
    states = [(r["status"], r["attempts"], r["last_error_class"]) for r in rows()]
    assert states[0] == ("delivered", 1, None)
    assert states[1:] == [("pending", 0, "throttled")] * 5
    assert all(r["due_in"] > 3500 for r in rows()[1:])
    assert len(sent_messages()) == 1
    assert (summary.dead, summary.throttled) == (0, 5)


# (fault, summary.stopped, class the rest is released with, publisher overrides)
BATCH_OUTCOMES = {
    "account suspended": (("AccountSuspendedException", "The account is suspended", 400),
                          "stop_batch", "configuration", {}),
    "access denied (IAM)": (("AccessDeniedException", "User arn:aws:sts::123456789012:assumed-role/relay is not "
                             "authorized to perform ses:SendEmail on resource arn:aws:ses:us-east-1:"
                             f"123456789012:identity/{SENDER_IDENTITY}", 403),
                            "stop_batch", "configuration", {}),
    "configured sender not verified": (("MessageRejected", "Email address is not verified. The following "
                                        f"identities failed the check in region US-EAST-1: {SENDER_IDENTITY}",
                                        400), "stop_batch", "configuration", {}),
    "configured MAIL FROM domain not verified": (("MailFromDomainNotVerifiedException", "MAIL FROM domain not "
                                                  "verified", 400), "stop_batch", "configuration", {}),
    "configured configuration set missing": (("NotFoundException", f"Configuration set <{CONFIGURATION_SET}> "
                                              "does not exist.", 404), "stop_batch", "configuration", {}),
    "sending paused": (("SendingPausedException", "Sending is paused for this account", 400),
                       "downstream_unavailable", "downstream_unavailable", {}),
}


def test_our_configuration_or_account_refused_stops_the_batch_and_refunds(ses, ses_store, enqueue_mail,
                                                                          app_engine, policy, plenty, rows):
    for case, (fault, stopped, release_class, overrides) in BATCH_OUTCOMES.items():
        # Given six emails; the third send is refused for a reason that is ours, not the message's
        with app_engine.begin() as conn:
            conn.execute(text("DELETE FROM outbox_message"))
        sent_before = len(sent_messages())
        enqueue_mail(6, to=lambda i: [VICTIM] if i == 2 else [f"user{i}@example.com"])
        remove = _fail_victim(ses, fault)

        # When one invocation sends one at a time, recording each send as it completes
        publisher = make_publisher(ses, max_concurrency=1, record_group_size=1, **overrides)
        summary = RelayLoop(ses_store, publisher, policy, plenty, "owner-" + case).run()
        remove()
        publisher.account_hook()

        # Then the two sent before it stay delivered, and it and the rest are pending again with
        # their attempts refunded (nothing dead: it would otherwise dead-letter the whole queue)
        assert summary.stopped == stopped, case
        states = [(r["status"], r["attempts"], r["last_error_class"]) for r in rows()]
        assert states[:2] == [("delivered", 1, None)] * 2, case
        assert states[2:] == [("pending", 0, release_class)] * 4, case
        assert (summary.delivered, summary.released, summary.dead) == (2, 4, 0), case
        assert len(sent_messages()) - sent_before == 2, case


def test_message_with_its_own_missing_configuration_set_is_dead_not_a_batch_stop(ses, ses_store, enqueue_mail,
                                                                                 policy, plenty, rows):
    # Given an email naming a configuration set of its own that SES does not know
    enqueue_mail(3, configuration_set=lambda i: "no-such-set" if i == 1 else None)
    fail_send_email(ses, lambda r: ("NotFoundException", "Configuration set <no-such-set> does not exist.", 404)
                    if r.get("ConfigurationSetName") == "no-such-set" else None)

    # When the relay runs
    summary = RelayLoop(ses_store, make_publisher(ses), policy, plenty, "owner-1").run()

    # Then only that message is dead; the batch went on
    assert summary.stopped is None
    assert [(r["status"], r["destination"]) for r in rows()] == [
        ("delivered", "ses"), ("dead", "no-such-set"), ("delivered", "ses")]


def test_iam_refusal_of_a_sender_the_message_chose_is_dead_not_a_batch_stop(ses, ses_store, enqueue_mail, policy,
                                                                            plenty, rows):
    # Given an email from a sender identity of its own that our IAM policy does not allow
    enqueue_mail(3, sender=lambda i: "Other <news@other.example>" if i == 1 else None)
    fail_send_email(ses, lambda r: ("AccessDeniedException", "User arn:aws:sts::123456789012:assumed-role/relay "
                                    "is not authorized to perform ses:SendEmail on resource "
                                    "arn:aws:ses:us-east-1:123456789012:identity/other.example", 403)
                    if "other.example" in r["FromEmailAddress"] else None)

    # When the relay runs
    summary = RelayLoop(ses_store, make_publisher(ses), policy, plenty, "owner-1").run()

    # Then only that message is dead; the batch went on
    assert summary.stopped is None
    assert [(r["status"], r["last_error_class"]) for r in rows()] == [
        ("delivered", None), ("dead", "permanent"), ("delivered", None)]


def test_transient_failures_dead_letter_after_max_attempts(ses, ses_store, enqueue_mail, policy, plenty, rows,
                                                           app_engine):
    # Given an email whose sends always fail with a 5xx, on its last allowed attempt
    enqueue_mail(1, to=[VICTIM], max_attempts=2)
    _fail_victim(ses, ("InternalFailure", "internal error", 500))
    publisher = make_publisher(ses)
    RelayLoop(ses_store, publisher, policy, plenty, "owner-1").run()
    assert (rows()[0]["status"], rows()[0]["attempts"]) == ("pending", 1)
    with app_engine.begin() as conn:
        conn.execute(text("UPDATE outbox_message SET available_at = now()"))

    # When it fails again
    RelayLoop(ses_store, publisher, policy, plenty, "owner-2").run()

    # Then it is dead with the transient class recorded
    assert (rows()[0]["status"], rows()[0]["attempts"], rows()[0]["last_error_class"]) == ("dead", 2, "transient")


GATE_CLOSED = [
    ({"sending_enabled": False}, "SendingEnabled=false"),
    ({"enforcement_status": "SHUTDOWN"}, "EnforcementStatus=SHUTDOWN"),
    ({"max_24_hour_send": 200.0, "sent_last_24_hours": 200.0}, "daily sending quota used up"),
    ({"error": ("TooManyRequestsException", "slow down", 429)}, "GetAccount failed (TooManyRequestsException)"),
]


def test_gate_closed_claims_nothing_and_says_why(ses, ses_store, enqueue_mail, policy, plenty, rows):
    # Given pending emails
    enqueue_mail(3)
    for account, reason in GATE_CLOSED:
        # And an account that cannot send now
        publisher = make_publisher(ses, get_account=account)

        # When the relay runs
        summary = RelayLoop(ses_store, publisher, policy, plenty, "owner-1").run()
        publisher.account_hook()

        # Then nothing is claimed, the summary says why, and nothing is sent
        assert summary.claimed == 0 and reason in summary.skipped, (account, summary.skipped)
        assert {(r["status"], r["attempts"]) for r in rows()} == {("pending", 0)}
        assert sent_messages() == []


def test_get_account_is_read_once_per_invocation_and_quota_bounds_the_claim(ses, ses_store, enqueue_mail, policy,
                                                                            plenty, rows):
    # Given 10 emails and an account with 4 sends left today
    enqueue_mail(10)
    publisher = make_publisher(ses, get_account={"max_24_hour_send": 50.0, "sent_last_24_hours": 46.0})

    # When one invocation runs
    summary = RelayLoop(ses_store, publisher, policy, plenty, "owner-1").run()

    # Then GetAccount was called once and only the quota left was claimed and sent
    assert len(publisher.account_hook.calls) == 1
    assert (summary.claimed, summary.delivered) == (4, 4)
    assert len(sent_messages()) == 4
