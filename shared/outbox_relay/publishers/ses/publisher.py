"""Amazon SES v2 publisher: ``SendEmail`` paced by MaxSendRate, each poller at its share of it so
overlapping pollers never exceed it together."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ...errors import ConfigurationError, InvalidMessageError
from ...feedback.hashing import normalise
from ...models import ClaimedMessage, DeliveryResult, ErrorClass
from ...observability import logger as log
from ..aws_client import GATE_INTERVAL_SECONDS, client_for
from ..base import Deadline, Publisher, RecordResults
from ..registry import Channel
from .addresses import address_of, parse_address
from .payload import CONFIGURATION_SET_RE, EmailPayload, load_payload
from .pool import RATE_HEADROOM, RECORD_INTERVAL_SECONDS, SendBatch, SendRateLimiter, SendSettings
from .requests import Prepared, prepare

#: Rate used when GetAccount reports none (the SES sandbox's).
FALLBACK_SEND_RATE = 1.0


def supports_simple_headers(client: Any) -> bool:
    """Whether this botocore knows ``Message.Headers``; older ones send custom headers as raw MIME."""
    try:
        return "Headers" in client.meta.service_model.shape_for("Message").members
    except Exception:
        return False


class SesPublisher(Publisher):
    """The arguments are the OUTBOX_SES_* settings; `settle_seconds` None: no feedback."""

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
            max(1, int(max_concurrency)), max(1, int(record_group_size)), record_interval_seconds,
            float(quota_deferral_seconds), address_of(default_sender) if default_sender else None,
            default_configuration_set, settle_seconds)
        self.suppression = suppression
        self._share: Callable[[], float] | None = None
        self._clock = clock
        self._rate: float | None = None
        self._quota_left: int | None = None
        self._simple_headers = supports_simple_headers(client)
        self.begin(None)

    def begin(self, deadline: Deadline | None) -> None:
        self._gated_at: float | None = None
        self._gate_reason: str | None = None
        self._limiter: SendRateLimiter | None = None

    def share_rate(self, share: Callable[[], float]) -> None:
        self._share = share

    def rate_share(self) -> float:
        return 1.0 if self._share is None else self._share()

    def gate(self) -> str | None:
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
        return self._rate or self.max_send_rate or FALLBACK_SEND_RATE

    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        if seconds_available <= 0:
            return 0
        n = int(self.send_rate() / (1.0 + RATE_HEADROOM) * seconds_available)
        if self._quota_left is not None:
            n = min(n, self._quota_left)
        return max(0, min(batch_size, n))

    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        if not messages:
            return
        if self._limiter is None or self._limiter.full_rate != self.send_rate():
            self._limiter = SendRateLimiter(self.send_rate(), clock=self._clock, share=self.rate_share)
        prepare_one = self.prepare if self.suppression is None else self.suppressing(messages)
        SendBatch(self.client, self.settings, self._limiter, deadline, record, self._clock).run(messages, prepare_one)

    def prepare(self, m: ClaimedMessage, payload: EmailPayload | None = None) -> Prepared | DeliveryResult | None:
        return prepare(m, default_sender=self.default_sender, default_configuration_set=self.default_configuration_set,
                       simple_headers=self._simple_headers, payload=payload)

    def suppressing(self, messages: Sequence[ClaimedMessage]) -> Callable[[ClaimedMessage],
                                                                         Prepared | DeliveryResult | None]:
        """`prepare`, the batch's recipients checked against the suppression list in one statement."""
        payloads: dict[int, EmailPayload] = {}
        for m in messages:
            try:
                payloads[m.seq] = load_payload(m.payload_json)
            except InvalidMessageError:
                continue
        reasons = self.suppression.reasons(address_of(a) for p in payloads.values() for a in (*p.to, *p.cc, *p.bcc))
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
    client = client_for(settings, client, "sesv2", "SES", settings.ses_max_concurrency)
    default_sender = None
    if settings.ses_from:
        try:
            default_sender = parse_address(settings.ses_from)
        except ValueError as exc:
            raise ConfigurationError("OUTBOX_SES_FROM", str(exc)) from None
    config_set = settings.ses_configuration_set or None
    if config_set is not None and not CONFIGURATION_SET_RE.fullmatch(config_set):
        raise ConfigurationError("OUTBOX_SES_CONFIGURATION_SET", "must be 1-64 ASCII letters, digits, '_' or '-'")
    return SesPublisher(
        client, default_sender=default_sender, default_configuration_set=config_set,
        max_concurrency=settings.ses_max_concurrency, record_group_size=settings.ses_record_group_size,
        quota_deferral_seconds=settings.ses_quota_deferral_seconds, max_send_rate=settings.ses_max_send_rate,
        settle_seconds=settings.ses_settle_seconds if settings.ses_feedback else None,
        suppression=suppression_list(settings) if settings.ses_suppression_on else None)


def suppression_list(settings: Any) -> Any:
    from ...feedback.hashing import address_hasher
    from ...feedback.store import SuppressionList
    from ...runtime import get_engine

    return SuppressionList(get_engine(), address_hasher(settings))
