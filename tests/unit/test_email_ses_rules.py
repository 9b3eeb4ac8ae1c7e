"""The SES publisher's rules without any server: error classification, the token bucket,
the claim size, the GetAccount gate and grouped recording (botocore Stubber, no sockets)."""

from __future__ import annotations

import threading
import uuid

import boto3
import pytest
from botocore.stub import Stubber

from outbox_relay.models import ClaimedMessage, ErrorClass, Status
from outbox_relay.publishers.base import Deadline
from outbox_relay.publishers.ses.errors import Verdict, classify_client_error
from outbox_relay.publishers.ses.message import message_row
from outbox_relay.publishers.ses.pool import SendRateLimiter
from outbox_relay.publishers.ses.publisher import SesPublisher
from outbox_relay.publishers.ses.requests import mailboxes, redact, redactions

SENDER = "noreply@shop.example"
C, P, T, TH, D = (ErrorClass.CONFIGURATION, ErrorClass.PERMANENT, ErrorClass.TRANSIENT, ErrorClass.THROTTLED,
                  ErrorClass.DOWNSTREAM_UNAVAILABLE)


# code, message, status, message's own sender, own configuration set → class, verdict
TABLE = [
    ("TooManyRequestsException", "Too many requests", 429, None, None, TH, Verdict.MESSAGE),
    ("LimitExceededException", "limit", 400, None, None, TH, Verdict.MESSAGE),
    ("Throttling", "Maximum sending rate exceeded.", 400, None, None, TH, Verdict.MESSAGE),
    ("MessageRejected", "Throttling failure: Maximum sending rate exceeded", 400, None, None, TH, Verdict.MESSAGE),
    ("Throttling", "Daily message quota exceeded.", 400, None, None, TH, Verdict.QUOTA),
    ("AccountSuspendedException", "suspended", 400, None, None, C, Verdict.STOP),
    ("SendingPausedException", "paused", 400, None, None, D, Verdict.PAUSED),
    ("AccessDeniedException", f"not authorized on identity/{SENDER}", 403, None, None, C, Verdict.STOP),
    ("AccessDeniedException", "not authorized on identity/other.example", 403, "x@other.example", None,
     P, Verdict.MESSAGE),
    ("AccessDeniedException", "not authorized on configuration-set/mine", 403, None, "mine", P, Verdict.MESSAGE),
    ("UnrecognizedClientException", "bad token", 400, None, None, C, Verdict.STOP),
    ("MessageRejected", f"Email address is not verified: {SENDER}", 400, None, None, C, Verdict.STOP),
    ("MessageRejected", "Email address is not verified: x@other.example", 400, "x@other.example", None,
     P, Verdict.MESSAGE),
    ("MessageRejected", "Email address is not verified: bob@example.com", 400, None, None, P, Verdict.MESSAGE),
    ("MessageRejected", "Unsupported attachment type", 400, None, None, P, Verdict.MESSAGE),
    ("MailFromDomainNotVerifiedException", "MAIL FROM not verified", 400, None, None, C, Verdict.STOP),
    ("MailFromDomainNotVerifiedException", "MAIL FROM not verified", 400, "x@other.example", None,
     P, Verdict.MESSAGE),
    ("NotFoundException", "Configuration set <transactional> does not exist", 404, None, None, C, Verdict.STOP),
    ("NotFoundException", "Configuration set <mine> does not exist", 404, None, "mine", P, Verdict.MESSAGE),
    ("BadRequestException", "Invalid header", 400, None, None, P, Verdict.MESSAGE),
    ("BadRequestException", "Configuration set transactional is disabled", 400, None, None, C, Verdict.STOP),
    ("InternalFailure", "oops", 500, None, None, T, Verdict.MESSAGE),
    ("ServiceUnavailable", "later", 503, None, None, T, Verdict.MESSAGE),
    ("SomethingNew", "unknown", 400, None, None, T, Verdict.MESSAGE),
]


@pytest.mark.parametrize("code, message, status, own_sender, own_set, error_class, verdict", TABLE)
def test_error_classification_table(code, message, status, own_sender, own_set, error_class, verdict):
    c = classify_client_error(code, message, own_sender=own_sender, own_configuration_set=own_set,
                              default_sender=SENDER, default_configuration_set="transactional")
    assert (c.error_class, c.verdict) == (error_class, verdict)


def test_stored_error_text_loses_the_messages_addresses():
    p = message_row(dict(to=["박지우 <jiwoo@example.com>"], cc=["cc@example.com"], subject="s", text="t"))
    from outbox_relay.publishers.ses.payload import load_payload

    pairs = redactions(mailboxes(load_payload(p["payload"]), "Shop <noreply@shop.example>"))
    text = ("Email address is not verified. The following identities failed the check: jiwoo@example.com, "
            "CC@EXAMPLE.COM, noreply@shop.example, stranger@elsewhere.example")
    assert redact(text, pairs) == ("Email address is not verified. The following identities failed the check: "
                                    "<to>, <cc>, <from>, <address>")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:  # sleeps by moving the clock; never stopped
        self.now += seconds
        return False


def test_token_bucket_spaces_grants_by_recipients():
    clock = FakeClock()
    bucket = SendRateLimiter(10, clock=clock)  # 10/s with 3% headroom: one grant per 0.103 s
    times = []
    for cost in (1, 1, 3, 1):
        assert bucket.acquire(cost, wait=clock.wait)
        times.append(round(clock.now - 100.0, 4))
    # the first goes at once, then one interval each; a 3-recipient email costs three intervals
    assert times == [0.0, 0.103, 0.206, 0.515]
    # and any 11 grants in a row span more than a second (at most 10 in any one-second window)
    more = []
    for _ in range(30):
        assert bucket.acquire(1, wait=clock.wait)
        more.append(clock.now)
    assert min(b - a for a, b in zip(more, more[10:])) > 1.0


def test_token_bucket_catches_up_after_a_pause_without_exceeding_the_window():
    # Given grants at the paced rate, then a 0.3 s pause (the process stalled), then more
    clock = FakeClock()
    bucket = SendRateLimiter(10, clock=clock)
    grants = []
    for i in range(40):
        if i == 15:
            clock.now += 0.3
        assert bucket.acquire(1, wait=clock.wait)
        grants.append(clock.now)

    # Then the pause is made up (grants closer together until the schedule is caught up:
    # here it lagged 0.2 s, less than the 0.25 s allowed), so the run takes no longer ...
    assert grants[15] == grants[16] and grants[17] - grants[16] < 0.103
    assert grants[-1] - grants[0] == pytest.approx(39 * 0.103)
    # ... and still no window of 1.03 s ever holds more than 10 grants
    assert max(sum(1 for t in grants if g <= t < g + 1.03) for g in grants) <= 10


def test_an_email_with_more_recipients_than_the_rate_goes_alone():
    clock = FakeClock()
    bucket = SendRateLimiter(2, clock=clock)
    assert bucket.acquire(5, wait=clock.wait) and clock.now == 100.0  # an empty window admits it
    assert bucket.acquire(1, wait=clock.wait)
    assert clock.now == pytest.approx(100.0 + 5 * 1.03 / 2)  # the next waits for its five intervals


def test_token_bucket_gives_up_at_the_deadline_and_holds_after_a_throttle():
    clock = FakeClock()
    bucket = SendRateLimiter(1, clock=clock)
    assert bucket.acquire(1, wait=clock.wait)
    assert not bucket.acquire(1, seconds_left=lambda: 0.5, wait=clock.wait)  # next slot is 1.03 s away
    assert clock.now == 100.0
    bucket.hold(5.0)
    assert bucket.acquire(1, wait=clock.wait) and clock.now == pytest.approx(105.0)
    stopped = SendRateLimiter(1, clock=clock)
    assert stopped.acquire(1, wait=lambda s: True)
    assert not stopped.acquire(1, wait=lambda s: True)  # a stop event woke the waiter: no grant


def _client():
    return boto3.client("sesv2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def _account(sending=True, rate=14.0, max24=50_000.0, sent=0.0, status="HEALTHY"):
    return {"SendingEnabled": sending, "EnforcementStatus": status,
            "SendQuota": {"MaxSendRate": rate, "Max24HourSend": max24, "SentLast24Hours": sent}}


@pytest.mark.parametrize("account, override, reason, rate", [
    (_account(), None, None, 14.0),
    (_account(), 5.0, None, 5.0),  # OUTBOX_SES_MAX_SEND_RATE caps the account's rate
    (_account(), 100.0, None, 14.0),  # ... and never raises it
    (_account(max24=-1.0, sent=10**9), None, None, 14.0),  # -1: unlimited quota
    (_account(sending=False), None, "SendingEnabled=false", None),
    (_account(status="SHUTDOWN"), None, "EnforcementStatus=SHUTDOWN", None),
    (_account(max24=200.0, sent=200.0), None, "daily sending quota used up", None),
])
def test_gate_reads_get_account_once(account, override, reason, rate):
    client = _client()
    with Stubber(client) as stub:
        stub.add_response("get_account", account, {})
        publisher = SesPublisher(client, default_sender=SENDER, max_send_rate=override)
        got = publisher.gate()
        stub.assert_no_pending_responses()
    if reason is None:
        assert got is None and publisher.send_rate() == rate
    else:
        assert reason in got


def test_gate_closed_when_get_account_fails():
    client = _client()
    with Stubber(client) as stub:
        stub.add_client_error("get_account", "AccessDeniedException", "no", 403)
        assert SesPublisher(client).gate() == "ses GetAccount failed (AccessDeniedException)"


def test_claim_limit_is_rate_times_seconds_within_quota_and_batch():
    client = _client()
    with Stubber(client) as stub:
        stub.add_response("get_account", _account(rate=14.0, max24=1000.0, sent=900.0), {})
        publisher = SesPublisher(client, default_sender=SENDER)
        assert publisher.gate() is None
    assert publisher.claim_limit(500, 0) == 0
    assert publisher.claim_limit(500, 5.0) == int(14 / 1.03 * 5.0)  # 67
    assert publisher.claim_limit(50, 5.0) == 50
    assert publisher.claim_limit(500, 60.0) == 100  # the quota left today


def _claimed(n: int) -> list[ClaimedMessage]:
    out = []
    for i in range(n):
        row = message_row(dict(to=[f"u{i}@example.com"], subject=f"s{i}", text="t"))
        out.append(ClaimedMessage(i + 1, str(row["message_id"]), Status.LEASED, "ses", "email", None, row["payload"],
                                  None, 1, 5, "2026-11-29T19:00:00.000000Z"))
    return out


def test_results_are_recorded_in_groups_from_the_calling_thread():
    # Given 12 messages, groups of 5, one send at a time, answered by the Stubber
    client = _client()
    messages = _claimed(12)
    groups: list[list] = []
    threads: set[str] = set()

    def record(results):
        threads.add(threading.current_thread().name)
        groups.append([(r.seq, r.delivery_ref) for r in results])

    with Stubber(client) as stub:
        for m in messages:
            stub.add_response("send_email", {"MessageId": f"ses-{m.seq}"},
                              {"FromEmailAddress": SENDER, "Destination": {"ToAddresses": [f"u{m.seq - 1}@example.com"]},
                               "Content": {"Simple": {"Subject": {"Data": f"s{m.seq - 1}", "Charset": "UTF-8"},
                                                      "Body": {"Text": {"Data": "t", "Charset": "UTF-8"}}}},
                               "EmailTags": [{"Name": "outbox-message-id", "Value": str(m.message_id)}]})
        publisher = SesPublisher(client, default_sender=SENDER, max_concurrency=1, record_group_size=5,
                                 max_send_rate=1000.0, record_interval_seconds=60.0)
        publisher.deliver(messages, Deadline(lambda: 60_000, 5), record)
        stub.assert_no_pending_responses()

    # Then outcomes arrive as 5, 5, 2, in send order, each with its SES MessageId, from the caller's thread
    assert [len(g) for g in groups] == [5, 5, 2]
    assert [ref for g in groups for _, ref in g] == [f"ses-{i}" for i in range(1, 13)]
    assert threads == {threading.current_thread().name}


def test_no_sender_anywhere_stops_the_batch():
    from outbox_relay.errors import StopBatch

    client = _client()
    with Stubber(client):
        publisher = SesPublisher(client, default_sender=None, max_send_rate=1000.0)
        with pytest.raises(StopBatch, match="OUTBOX_SES_FROM"):
            publisher.deliver(_claimed(2), Deadline(lambda: 60_000, 5), lambda results: None)


def test_message_id_is_the_first_email_tag():
    client = _client()
    [m] = _claimed(1)
    prepared = SesPublisher(client, default_sender=SENDER, default_configuration_set="tx").prepare(m)
    assert prepared.request["EmailTags"][0] == {"Name": "outbox-message-id", "Value": str(m.message_id)}
    assert prepared.request["ConfigurationSetName"] == "tx"
    assert prepared.request["EmailTags"][0]["Value"] == str(uuid.UUID(m.message_id))


@pytest.mark.parametrize("margin, expected", [(4.0, (2.0, 1.0)), (5.0, (2.0, 2.0)), (10.0, (2.0, 7.0)),
                                              (60.0, (2.0, 15.0))])
def test_ses_client_timeouts_fit_inside_the_deadline_margin(margin, expected):
    from outbox_relay.publishers.aws_client import call_timeouts

    connect, read = call_timeouts(margin, "SES")
    assert (connect, read) == expected
    assert connect + read <= margin - 1.0  # at least a second left to record the outcome


def test_a_deadline_margin_too_small_for_sane_timeouts_is_a_configuration_error():
    from outbox_relay.errors import ConfigurationError
    from outbox_relay.publishers.aws_client import call_timeouts

    with pytest.raises(ConfigurationError) as err:
        call_timeouts(3.5, "SES")
    assert err.value.variable == "OUTBOX_DEADLINE_MARGIN_SECONDS" and "at least 4s" in str(err.value)
