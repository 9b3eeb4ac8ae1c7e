"""Amazon SES (API v2) publisher: a ``GetAccount`` gate, paced concurrent
``SendEmail`` calls, outcomes recorded in small groups as sends complete.

One invocation:

1. `gate()` calls ``GetAccount`` once: sending must be enabled, the account not
   shut down, and the 24-hour quota not used up; it reads ``MaxSendRate`` (capped
   by OUTBOX_SES_MAX_SEND_RATE when set) for the whole invocation.
2. `claim_limit()` claims no more than can be sent at that rate before the
   deadline (and no more than the quota left).
3. `deliver()` sends through the pool (`pool.SendBatch`), paced by the rate
   limiter (`rate.SendRateLimiter`), each error classified by whose fault it is
   (`errors.classify_exception`).

An invocation of several batches (drain, latency) keeps one limiter for all
of them, so the rate holds across batches, and asks GetAccount again only
every `GATE_INTERVAL_SECONDS`. A latency-mode poller paces at its share of the
rate (`share_rate`: one over the live pollers of the channel, from the poller
registry), so pollers that overlap at a handover never exceed it together.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Sequence

from ...email.addresses import address_of, parse_address
from ...email.payload import EmailPayload, load_payload
from ...errors import ConfigurationError, InvalidMessageError
from ...feedback.hashing import normalise
from ...models import Channel, ClaimedMessage, DeliveryResult, ErrorClass
from ...observability import logger as log
from ..base import Deadline, Publisher, RecordResults
from .client import create_ses_client, ses_timeouts, supports_simple_headers
from .pool import RECORD_INTERVAL_SECONDS, SendBatch, SendSettings
from .rate import RATE_HEADROOM, SendRateLimiter
from .requests import Prepared, prepare

#: Rate used when GetAccount reports none (the SES sandbox's MaxSendRate, 1 per second).
FALLBACK_SEND_RATE = 1.0
#: Within one invocation, GetAccount is asked again after this many seconds, not before every claim.
GATE_INTERVAL_SECONDS = 10.0
_CONFIGURATION_SET_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class SesPublisher(Publisher):
    """Sends claimed emails through SES v2 ``SendEmail``.

    Args:
        client: a boto3 ``sesv2`` client (`get_account`, `send_email` are used).
        default_sender: canonical From mailbox for messages without one (OUTBOX_SES_FROM).
        default_configuration_set: OUTBOX_SES_CONFIGURATION_SET, or None.
        max_concurrency: sends in flight at once (threads).
        record_group_size: completed sends per `record` call (the duplicate window).
        quota_deferral_seconds: deferral when the daily quota is exceeded, seconds.
        max_send_rate: cap on the account's MaxSendRate, recipients per second, as SES
            counts its quotas (None: none).
        record_interval_seconds: longest wait of a completed send before it is recorded, seconds.
        clock: monotonic clock, seconds (tests may pass their own).
        settle_seconds: with feedback on the default configuration set, how long a send
            whose answer was lost waits for its SES event, seconds (None: transient, as without).
        suppression: the suppression list (a `feedback.store.SuppressionList`), checked
            once per batch for every recipient; None: not checked.
    """

    channel = Channel.SES
    pipelined = False
    rate_shared = True

    def __init__(self, client: Any, *, default_sender: str | None = None,
                 default_configuration_set: str | None = None, max_concurrency: int = 8,
                 record_group_size: int = 10, quota_deferral_seconds: float = 3600.0,
                 max_send_rate: float | None = None, record_interval_seconds: float = RECORD_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, settle_seconds: float | None = None,
                 suppression: Any | None = None) -> None:
        self.client = client
        self.default_sender = default_sender
        self.default_configuration_set = default_configuration_set
        self.max_send_rate = max_send_rate
        self.settings = SendSettings(
            max_concurrency=max(1, int(max_concurrency)),
            record_group_size=max(1, int(record_group_size)),
            record_interval_seconds=record_interval_seconds,
            quota_deferral_seconds=float(quota_deferral_seconds),
            default_sender_address=address_of(default_sender) if default_sender else None,
            default_configuration_set=default_configuration_set,
            settle_seconds=settle_seconds,
        )
        self.suppression = suppression
        self._share: Callable[[], float] | None = None
        self._clock = clock
        self._rate: float | None = None
        self._quota_left: int | None = None
        self._simple_headers = supports_simple_headers(client)
        self._begin(None)

    def _begin(self, deadline: Deadline | None) -> None:
        self._deadline = deadline
        self._started = self._clock()
        self._gated_at: float | None = None
        self._gate_reason: str | None = None
        self._limiter: SendRateLimiter | None = None

    def begin(self, deadline: Deadline) -> None:
        """A new invocation: GetAccount again at the next gate, a new limiter."""
        self._begin(deadline)

    def share_rate(self, share: Callable[[], float]) -> None:
        """From now on, pace at `share()` (0..1) of the rate: a latency-mode poller's
        share among the channel's live pollers (each poller sets its own)."""
        self._share = share

    def rate_share(self) -> float:
        """The share of the rate this invocation paces at (see `share_rate`)."""
        return 1.0 if self._share is None else self._share()

    @property
    def max_concurrency(self) -> int:
        return self.settings.max_concurrency

    # -- gate and claim size --------------------------------------------------------------------
    def gate(self) -> str | None:
        """Call ``GetAccount`` (SES API v2 reference, "GetAccount"): a reason when
        sending is disabled, the account is shut down or the 24-hour quota is used
        up (nothing is claimed), else None. Reads ``MaxSendRate`` for this invocation.
        Within an invocation the answer is reused for `GATE_INTERVAL_SECONDS`."""
        now = self._clock()
        if self._gated_at is not None and now - self._gated_at < GATE_INTERVAL_SECONDS:
            return self._gate_reason
        self._gated_at = now
        self._gate_reason = self._ask_account()
        return self._gate_reason

    def _ask_account(self) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        self._rate, self._quota_left = None, None
        try:
            account = self.client.get_account()
        except ClientError as exc:
            code = (exc.response.get("Error") or {}).get("Code", "Unknown")
            return f"ses GetAccount failed ({code})"
        except BotoCoreError as exc:
            return f"ses unavailable ({type(exc).__name__})"
        if account.get("SendingEnabled") is False:
            return "ses sending is paused for the account (SendingEnabled=false)"
        if account.get("EnforcementStatus") == "SHUTDOWN":
            return "ses account is shut down (EnforcementStatus=SHUTDOWN)"
        quota = account.get("SendQuota") or {}
        max24, sent = quota.get("Max24HourSend"), float(quota.get("SentLast24Hours") or 0)
        if max24 is not None and max24 >= 0:  # -1 means unlimited ("SendQuota")
            left = int(max24 - sent)
            if left < 1:
                return f"ses daily sending quota used up ({sent:g} of {max24:g} in the last 24 hours)"
            self._quota_left = left
        account_rate = quota.get("MaxSendRate")
        rate = float(account_rate) if account_rate and account_rate > 0 else None
        if self.max_send_rate is not None:
            rate = min(rate, self.max_send_rate) if rate else self.max_send_rate
        self._rate = rate or FALLBACK_SEND_RATE
        log.info("ses gate open", extra={"max_send_rate": account_rate, "rate_used": self._rate,
                                          "quota_left": self._quota_left})
        return None

    def send_rate(self) -> float:
        """Recipients per second this invocation may send to (MaxSendRate, capped); before
        the gate ran: OUTBOX_SES_MAX_SEND_RATE or the sandbox's 1 per second."""
        return self._rate or self.max_send_rate or FALLBACK_SEND_RATE

    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        """At most what the paced rate can send in `seconds_available` seconds
        (single-recipient messages), at most the 24-hour quota left, at most `batch_size`."""
        if seconds_available <= 0:
            return 0
        n = int(self.send_rate() / (1.0 + RATE_HEADROOM) * seconds_available)
        if self._quota_left is not None:
            n = min(n, self._quota_left)
        return max(0, min(batch_size, n))

    # -- delivery ---------------------------------------------------------------------------------
    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        """Send `messages`, recording results in groups as they complete.

        Raises `StopBatch` (our account, credentials, sender identity or
        configuration set refused) or `DownstreamUnavailable` (sending paused)
        after recording what completed; the relay releases the rest with
        attempts refunded. Messages not started before the deadline are not
        reported (the relay releases them).

        Deadline invariant: no send starts once `deadline.seconds_left()` (the time
        left minus OUTBOX_DEADLINE_MARGIN_SECONDS) is ≤ 0, and every send ends within
        the client's connect + read timeouts, at most margin − 1 s (`client.ses_timeouts`);
        so a send started before the margin always completes or times out before
        the Lambda deadline, and once the margin is reached each completion is
        recorded at once, leaving time to record it.
        """
        if not messages:
            return
        if self._limiter is None or self._limiter.full_rate != self.send_rate():
            self._limiter = SendRateLimiter(self.send_rate(), clock=self._clock, share=self.rate_share)
        if self._deadline is None:
            self._deadline = deadline
        prepare_one = self.prepare if self.suppression is None else self.suppressing(messages)
        SendBatch(self.client, self.settings, self._limiter, deadline, record, self._clock).run(messages, prepare_one)

    def prepare(self, m: ClaimedMessage, payload: EmailPayload | None = None) -> Prepared | DeliveryResult | None:
        """The ``SendEmail`` request of one message (see `requests.prepare`)."""
        return prepare(m, default_sender=self.default_sender, default_configuration_set=self.default_configuration_set,
                       simple_headers=self._simple_headers, payload=payload)

    def suppressing(self, messages: Sequence[ClaimedMessage]) -> Callable[[ClaimedMessage],
                                                                         Prepared | DeliveryResult | None]:
        """`prepare` for this batch, checking every recipient against the suppression
        list in one statement first: a message with a suppressed recipient is
        dead-lettered (SUPPRESSED) without a send, its error naming the field, not
        the address. A payload that does not load is left to `prepare` to refuse."""
        payloads: dict[int, EmailPayload] = {}
        for m in messages:
            try:
                payloads[m.seq] = load_payload(m.payload_json)
            except InvalidMessageError:
                continue
        reasons = self.suppression.reasons(
            address_of(a) for p in payloads.values() for a in (*p.to, *p.cc, *p.bcc))
        suppressed: dict[int, str] = {}
        if reasons:
            for seq, p in payloads.items():
                for role, items in (("to", p.to), ("cc", p.cc), ("bcc", p.bcc)):
                    hit = next((i for i, a in enumerate(items) if normalise(address_of(a)) in reasons), None)
                    if hit is not None:
                        reason = reasons[normalise(address_of(items[hit]))]
                        suppressed[seq] = f"ses: not sent: {role}[{hit}] is on the suppression list ({reason})"
                        break

        def prepare_checked(m: ClaimedMessage) -> Prepared | DeliveryResult | None:
            if m.seq in suppressed:
                return DeliveryResult(m.seq, error_class=ErrorClass.SUPPRESSED, error=suppressed[m.seq])
            return self.prepare(m, payloads.get(m.seq))

        return prepare_checked


def build_ses_publisher(settings: Any, client: Any | None = None) -> SesPublisher:
    """The SES publisher for `settings` (OUTBOX_SES_*), with a new client unless one is given.

    Raises `ConfigurationError` naming OUTBOX_SES_FROM or OUTBOX_SES_CONFIGURATION_SET
    when they are malformed, or OUTBOX_DEADLINE_MARGIN_SECONDS when it is below
    `client.MIN_DEADLINE_MARGIN_SECONDS` (see `client.ses_timeouts`).
    """
    margin = float(settings.deadline_margin_seconds)
    ses_timeouts(margin)  # the margin check, also when a client is given
    default_sender = None
    if settings.ses_from:
        try:
            default_sender = parse_address(settings.ses_from)
        except ValueError as exc:
            raise ConfigurationError("OUTBOX_SES_FROM", str(exc)) from None
    config_set = settings.ses_configuration_set or None
    if config_set is not None and not _CONFIGURATION_SET_RE.fullmatch(config_set):
        raise ConfigurationError("OUTBOX_SES_CONFIGURATION_SET",
                                 "must be 1-64 ASCII letters, digits, '_' or '-'")
    return SesPublisher(
        client if client is not None else create_ses_client(
            max_concurrency=settings.ses_max_concurrency, deadline_margin_seconds=margin,
            region_name=settings.region),
        default_sender=default_sender,
        default_configuration_set=config_set,
        max_concurrency=settings.ses_max_concurrency,
        record_group_size=settings.ses_record_group_size,
        quota_deferral_seconds=settings.ses_quota_deferral_seconds,
        max_send_rate=settings.ses_max_send_rate,
        settle_seconds=settings.ses_settle_seconds if settings.ses_feedback else None,
        suppression=suppression_list(settings) if settings.ses_suppression_on else None,
    )


def suppression_list(settings: Any) -> Any:
    """The suppression list on the relay's engine (the container's), with the addresses' key."""
    from ...feedback.hashing import address_hasher
    from ...feedback.store import SuppressionList
    from ...runtime import get_engine

    return SuppressionList(get_engine(), address_hasher(settings))
