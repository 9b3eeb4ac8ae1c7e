"""Amazon SES (API v2) publisher: a GetAccount gate, paced concurrent SendEmail calls,
outcomes recorded in small groups as sends complete.

One invocation:

1. `gate()` calls ``GetAccount`` once: sending must be enabled, the account not
   shut down, and the 24-hour quota not used up; it reads ``MaxSendRate`` (capped
   by OUTBOX_SES_MAX_SEND_RATE when set) for the whole invocation.
2. `claim_limit()` claims no more than can be sent at that rate before the
   deadline (and no more than the quota left).
3. `deliver()` sends with a bounded thread pool (one boto3 client shared by
   the threads: clients are thread-safe, sessions are not; "Boto3 documentation",
   Clients, multithreading). A token bucket paces the calls below
   ``MaxSendRate``; the sending rate counts recipients, not messages ("Service
   quotas in Amazon SES": quotas are based on the number of recipients), so a
   message costs one token per recipient. Results are handed to the relay's
   `record` from the coordinating thread after every OUTBOX_SES_RECORD_GROUP_SIZE
   completions (or after `RECORD_INTERVAL_SECONDS`), so a crash re-sends at most
   that group plus what was in flight.

Errors are classified by whose fault they are (`classify_client_error`; the
table is in the README, "Email through Amazon SES"). The SDK's own retries are
off: a send retried inside the SDK after a timeout could deliver twice, and a
throttle retried there would hide the signal the pacing needs.
"""

from __future__ import annotations

import enum
import re
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..email import (MAX_MESSAGE_BYTES, OUTBOX_TAG, EmailPayload, address_of, build_mime, encode_address,
                     encode_header_value, field_errors, load_payload, parse_address)
from ..errors import ConfigurationError, DownstreamUnavailable, InvalidMessageError, StopBatch
from ..models import Channel, ClaimedMessage, DeliveryResult, ErrorClass
from ..observability import logger as log
from .base import Deadline, RecordResults


#: The bucket paces at MaxSendRate / (1 + RATE_HEADROOM), so N grants span 1.03 s.
RATE_HEADROOM = 0.03
#: A late grant (a garbage-collection pause, a busy interpreter) may catch up this much of the
#: schedule, seconds, so pauses do not lower the average rate (the window still caps every 1.03 s).
CATCH_UP_SECONDS = 0.25
#: After a "Maximum sending rate exceeded" throttle, no send starts for this long, seconds.
THROTTLE_PAUSE_SECONDS = 1.0
#: Completed sends wait at most this long before being recorded, seconds.
RECORD_INTERVAL_SECONDS = 1.0
#: Rate used when GetAccount reports none (the SES sandbox's 1 email per second).
FALLBACK_SEND_RATE = 1.0
#: Longest SES error text kept (after redaction), characters.
MAX_ERROR_TEXT = 300
#: The SES client's TCP connect timeout, seconds (see `ses_timeouts`).
CONNECT_TIMEOUT_SECONDS = 2.0
#: Time kept after the longest possible send to record its outcome, seconds.
RECORD_RESERVE_SECONDS = 1.0
#: Shortest read timeout worth having, and the longest one used, seconds.
MIN_READ_TIMEOUT_SECONDS = 1.0
MAX_READ_TIMEOUT_SECONDS = 15.0
#: Smallest OUTBOX_DEADLINE_MARGIN_SECONDS for the SES relay, seconds: connect + shortest read
#: + the record reserve. Below it a send started just before the margin could outlive the deadline.
MIN_DEADLINE_MARGIN_SECONDS = CONNECT_TIMEOUT_SECONDS + MIN_READ_TIMEOUT_SECONDS + RECORD_RESERVE_SECONDS

_THROTTLE_CODES = frozenset({"TooManyRequestsException", "LimitExceededException", "Throttling",
                             "ThrottlingException"})
_CREDENTIAL_CODES = frozenset({"AccessDeniedException", "AccessDenied", "UnrecognizedClientException",
                               "InvalidClientTokenId", "SignatureDoesNotMatch", "InvalidSignatureException",
                               "ExpiredToken", "ExpiredTokenException", "MissingAuthenticationTokenException",
                               "IncompleteSignature"})
_MESSAGE_CODES = frozenset({"MessageRejected", "MailFromDomainNotVerifiedException", "NotFoundException",
                            "BadRequestException", "InvalidParameterValue", "ValidationException"})
_ANY_ADDRESS = re.compile(r"[^\s<>\"',;:()]+@[^\s<>\"',;:()]+")


class Verdict(enum.Enum):
    """What one send attempt means for the batch."""

    DELIVERED = "delivered"  # SES accepted it
    MESSAGE = "message"  # this message's outcome (permanent, transient, throttled): recorded
    QUOTA = "quota"  # daily quota exceeded: deferred long, no further sends this invocation
    STOP = "stop"  # our account, credentials, identity or configuration set refused: StopBatch
    PAUSED = "paused"  # sending paused: DownstreamUnavailable
    NOT_STARTED = "not_started"  # never sent (deadline, batch stopped): the relay releases it


@dataclass(frozen=True, slots=True)
class Classification:
    error_class: ErrorClass
    verdict: Verdict


def classify_client_error(code: str, message: str, status: int | None, *, own_sender: str | None = None,
                          own_configuration_set: str | None = None, default_sender: str | None = None,
                          default_configuration_set: str | None = None) -> Classification:
    """Classify an SES v2 ``SendEmail`` error by whose fault it is.

    Args:
        code: the error code (``ClientError.response["Error"]["Code"]``).
        message: the error message; quota and rate throttles are told apart by it
            ("Errors related to the sending quotas for your Amazon SES account":
            "Daily message quota exceeded", "Maximum sending rate exceeded").
        status: the HTTP status code, if any.
        own_sender / own_configuration_set: the address and configuration set the
            message names itself (None when it uses the configured default).
        default_sender / default_configuration_set: OUTBOX_SES_FROM's address and
            OUTBOX_SES_CONFIGURATION_SET.

    The rules (SES API v2 reference, "SendEmail", Errors):
    - quota exceeded → throttled, deferred long (QUOTA); rate throttles
      (TooManyRequests, LimitExceeded, Throttling) → throttled, refunded;
    - AccountSuspended → configuration (STOP); SendingPaused → downstream
      unavailable (PAUSED);
    - credential or IAM refusals → configuration (STOP), unless they name the
      sender identity or configuration set the message chose itself (permanent);
    - MessageRejected / MailFromDomainNotVerified / NotFound / BadRequest:
      about a value from our configuration (the configured sender identity,
      the configured configuration set) every message would fail the same way →
      configuration (STOP); otherwise the message's fault → permanent;
    - 5xx and unknown codes → transient (retried with backoff).
    """
    text = (message or "").lower()
    if "daily message quota exceeded" in text:
        return Classification(ErrorClass.THROTTLED, Verdict.QUOTA)
    if code in _THROTTLE_CODES or "maximum sending rate exceeded" in text:
        return Classification(ErrorClass.THROTTLED, Verdict.MESSAGE)
    if code == "AccountSuspendedException":
        return Classification(ErrorClass.CONFIGURATION, Verdict.STOP)
    if code == "SendingPausedException":
        return Classification(ErrorClass.DOWNSTREAM_UNAVAILABLE, Verdict.PAUSED)
    if code in _CREDENTIAL_CODES:
        if _names_own_choice(text, own_sender, own_configuration_set):
            return Classification(ErrorClass.PERMANENT, Verdict.MESSAGE)
        return Classification(ErrorClass.CONFIGURATION, Verdict.STOP)
    if code in _MESSAGE_CODES:
        ours = False
        if own_sender is None and default_sender:
            if code == "MailFromDomainNotVerifiedException" or default_sender.lower() in text:
                ours = True
        if own_configuration_set is None and default_configuration_set:
            if code == "NotFoundException" or default_configuration_set.lower() in text:
                ours = True
        if ours:
            return Classification(ErrorClass.CONFIGURATION, Verdict.STOP)
        return Classification(ErrorClass.PERMANENT, Verdict.MESSAGE)
    return Classification(ErrorClass.TRANSIENT, Verdict.MESSAGE)


def _names_own_choice(text: str, own_sender: str | None, own_configuration_set: str | None) -> bool:
    """Whether an IAM refusal names the sender identity (address or domain) or the
    configuration set that the message chose itself."""
    if own_sender:
        domain = own_sender.rsplit("@", 1)[-1].lower()
        if own_sender.lower() in text or f"identity/{domain}" in text:
            return True
    return bool(own_configuration_set) and f"configuration-set/{own_configuration_set.lower()}" in text


def classify_exception(exc: BaseException, *, own_sender: str | None = None,
                       own_configuration_set: str | None = None, default_sender: str | None = None,
                       default_configuration_set: str | None = None) -> tuple[Classification, str]:
    """Classify any exception a ``SendEmail`` call raised; returns the classification and
    the error code (or exception type name) for the stored error text."""
    from botocore.exceptions import (BotoCoreError, ClientError, NoCredentialsError, NoRegionError,
                                     ParamValidationError, PartialCredentialsError)

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code") or "Unknown")
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        c = classify_client_error(code, str(err.get("Message") or ""), status, own_sender=own_sender,
                                  own_configuration_set=own_configuration_set, default_sender=default_sender,
                                  default_configuration_set=default_configuration_set)
        if c.error_class is ErrorClass.TRANSIENT and (status is None or status < 500):
            log.warning("unrecognised SES error code; retrying with backoff", extra={"error_code": code})
        return c, code
    if isinstance(exc, ParamValidationError):  # refused by the SDK before sending: this message's request
        return Classification(ErrorClass.PERMANENT, Verdict.MESSAGE), "ParamValidationError"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError, NoRegionError)):
        return Classification(ErrorClass.CONFIGURATION, Verdict.STOP), type(exc).__name__
    # Connection refused or reset, timeouts, TLS (BotoCoreError), or anything else: nobody's fault.
    return Classification(ErrorClass.TRANSIENT, Verdict.MESSAGE), type(exc).__name__


class SendRateLimiter:
    """Paces sends below `rate_per_second` (recipients per second): a token bucket
    of one token refilled at `rate_per_second / (1 + headroom)` (in the "generic
    cell rate algorithm" form: one timestamp, no timer thread), guarded by a
    sliding window that never grants more than `rate_per_second` tokens within
    `1 + headroom` seconds.

    `acquire(cost)` blocks until both allow a send *now*, then records the grant
    at the current clock, under a lock (grants are just in time: a thread that
    wakes late sends late and never makes the next one early). A grant that comes
    late (a garbage-collection pause, a busy interpreter) may catch up to
    `catch_up` seconds of the schedule, so pauses do not lower the average rate;
    the window keeps the catch-up from ever putting more than `rate_per_second`
    grants into 1.03 s. So no one-second window holds more than MaxSendRate
    sends unless the time from grant to request varies by more than 30 ms.
    A send costing more than the whole budget (an email with more recipients
    than the rate) waits for an empty window and goes alone. Thread-safe. Times
    are seconds of `clock`.
    """

    def __init__(self, rate_per_second: float, *, headroom: float = RATE_HEADROOM,
                 catch_up: float = CATCH_UP_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_second <= 0:
            raise ValueError("rate_per_second must be > 0")
        self.rate = rate_per_second
        self.interval = (1.0 + headroom) / rate_per_second
        self.window = 1.0 + headroom
        self.catch_up = catch_up
        self._clock = clock
        self._next: float | None = None
        self._granted: deque[tuple[float, int]] = deque()
        self._in_window = 0
        self._lock = threading.Lock()

    @property
    def effective_rate(self) -> float:
        """Grants per second at most (single-cost)."""
        return 1.0 / self.interval

    def acquire(self, cost: int = 1, *, seconds_left: Callable[[], float] = lambda: float("inf"),
                wait: Callable[[float], bool] = threading.Event().wait) -> bool:
        """Wait for a send of `cost` tokens (recipients). Returns False without a grant
        when the wait would outlast `seconds_left()` or `wait(seconds)` returns True
        (pass a stop event's `wait` to be woken when the batch stops)."""
        cost = max(1, int(cost))
        while True:
            with self._lock:
                now = self._clock()
                while self._granted and self._granted[0][0] <= now - self.window:
                    self._in_window -= self._granted.popleft()[1]
                delay = 0.0 if self._next is None else self._next - now
                if self._granted and self._in_window + cost > self.rate:
                    delay = max(delay, self._granted[0][0] + self.window - now)
                if delay <= 0:
                    base = now if self._next is None else max(self._next, now - self.catch_up)
                    self._next = base + cost * self.interval
                    self._granted.append((now, cost))
                    self._in_window += cost
                    return True
            if delay > seconds_left() or wait(delay):
                return False

    def hold(self, seconds: float) -> None:
        """Grant nothing for `seconds` from now (after a throttle)."""
        with self._lock:
            self._next = max(self._next or 0.0, self._clock() + seconds)


@dataclass(frozen=True, slots=True)
class _Prepared:
    seq: int
    request: dict[str, Any]
    cost: int
    own_sender: str | None
    own_configuration_set: str | None
    mailboxes: tuple[tuple[str, str], ...]  # (role, canonical mailbox), to redact error texts


@dataclass(frozen=True, slots=True)
class _Attempt:
    seq: int
    verdict: Verdict
    result: DeliveryResult | None = None
    code: str | None = None
    error: str | None = None


@dataclass
class _Tally:
    sent: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    not_started: int = 0


class SesPublisher:
    """Sends claimed emails through SES v2 ``SendEmail``.

    Args:
        client: a boto3 ``sesv2`` client (`get_account`, `send_email` are used).
        default_sender: canonical From mailbox for messages without one (OUTBOX_SES_FROM).
        default_configuration_set: OUTBOX_SES_CONFIGURATION_SET, or None.
        max_concurrency: sends in flight at once (threads).
        record_group_size: completed sends per `record` call (the duplicate window).
        quota_deferral_seconds: deferral when the daily quota is exceeded, seconds.
        max_send_rate: cap on the account's MaxSendRate, emails per second (None: none).
        clock: monotonic clock, seconds (tests may pass their own).
    """

    channel = Channel.SES

    def __init__(self, client: Any, *, default_sender: str | None = None,
                 default_configuration_set: str | None = None, max_concurrency: int = 8,
                 record_group_size: int = 10, quota_deferral_seconds: float = 3600.0,
                 max_send_rate: float | None = None, record_interval_seconds: float = RECORD_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.default_sender = default_sender
        self.default_sender_address = address_of(default_sender) if default_sender else None
        self.default_configuration_set = default_configuration_set
        self.max_concurrency = max(1, int(max_concurrency))
        self.record_group_size = max(1, int(record_group_size))
        self.quota_deferral_seconds = float(quota_deferral_seconds)
        self.max_send_rate = max_send_rate
        self.record_interval_seconds = record_interval_seconds
        self._clock = clock
        self._rate: float | None = None
        self._quota_left: int | None = None
        self._simple_headers = _supports_simple_headers(client)

    # -- gate and claim size --------------------------------------------------------------------
    def gate(self) -> str | None:
        """Call ``GetAccount`` (SES API v2 reference, "GetAccount"): a reason when
        sending is disabled, the account is shut down or the 24-hour quota is used
        up (nothing is claimed), else None. Reads ``MaxSendRate`` for this invocation."""
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
        """Emails per second this invocation may send (MaxSendRate, capped); before
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
        the client's connect + read timeouts, at most margin − 1 s (`ses_timeouts`);
        so a send started before the margin always completes or times out before
        the Lambda deadline, and once the margin is reached each completion is
        recorded at once (no waiting for its group), leaving time to record it.
        Any other exception is raised only after the sends already completed were
        recorded; an unexpected error preparing one message becomes a TRANSIENT
        result for that message.
        """
        if not messages:
            return
        limiter = SendRateLimiter(self.send_rate(), clock=self._clock)
        stop = threading.Event()
        pending: list[DeliveryResult] = []
        first_pending_at: list[float] = []
        reported: set[int] = set()
        failure: list[Exception] = []
        quota_hit = threading.Event()
        tally = _Tally()

        def flush(force: bool = False) -> None:
            if not pending:
                return
            if force or len(pending) >= self.record_group_size \
                    or self._clock() - first_pending_at[0] >= self.record_interval_seconds \
                    or deadline.passed():  # inside the margin: record each completion at once
                group = list(pending)
                pending.clear()
                first_pending_at.clear()
                record(group)

        def add(result: DeliveryResult) -> None:
            if not pending:
                first_pending_at.append(self._clock())
            pending.append(result)
            reported.add(result.seq)

        absorbed: set[Future] = set()

        def absorb(done: set[Future]) -> None:
            for fut in done:
                if fut in absorbed:
                    continue
                absorbed.add(fut)
                attempt: _Attempt = fut.result()  # _send never raises
                if attempt.verdict is Verdict.NOT_STARTED:
                    tally.not_started += 1
                    continue
                if attempt.verdict is Verdict.DELIVERED:
                    tally.sent += 1
                else:
                    key = attempt.code or "error"
                    tally.failed[key] = tally.failed.get(key, 0) + 1
                if attempt.verdict in (Verdict.DELIVERED, Verdict.MESSAGE, Verdict.QUOTA):
                    assert attempt.result is not None
                    add(attempt.result)
                    if attempt.result.error_class is ErrorClass.THROTTLED and attempt.verdict is Verdict.MESSAGE:
                        limiter.hold(THROTTLE_PAUSE_SECONDS)
                if attempt.verdict is Verdict.QUOTA and not quota_hit.is_set():
                    quota_hit.set()
                    stop.set()
                    log.warning("ses daily quota exceeded; deferring the rest of the batch")
                elif attempt.verdict in (Verdict.STOP, Verdict.PAUSED) and not failure:
                    stop.set()
                    exc_type = StopBatch if attempt.verdict is Verdict.STOP else DownstreamUnavailable
                    failure.append(exc_type(attempt.error or "ses refused the batch"))
                    log.error("ses refused our account or configuration; stopping the batch",
                              extra={"error_code": attempt.code, "verdict": attempt.verdict.value})

        def wait_some(in_flight: set[Future]) -> set[Future]:
            timeout = self.record_interval_seconds
            if pending:
                timeout = max(0.005, self.record_interval_seconds - (self._clock() - first_pending_at[0]))
            done, rest = wait(in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
            absorb(done)
            flush()
            return rest

        in_flight: set[Future] = set()
        with ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="ses-send") as pool:
            try:
                for m in messages:
                    if stop.is_set() or deadline.passed():
                        break
                    try:
                        prepared = self._prepare(m)
                    except Exception as exc:  # a bug of ours, not the message's content: retry it later
                        log.exception("unexpected error preparing an SES send",
                                      extra={"message_id": m.message_id, "error_type": type(exc).__name__})
                        prepared = DeliveryResult(m.seq, error_class=ErrorClass.TRANSIENT,
                                                  error=f"ses: unexpected error preparing the send "
                                                        f"({type(exc).__name__})")
                    if prepared is None:
                        stop.set()
                        failure.append(StopBatch("ses: no sender: OUTBOX_SES_FROM is not set and the message "
                                                 "names no 'from'"))
                        break
                    if isinstance(prepared, DeliveryResult):
                        tally.failed["InvalidPayload"] = tally.failed.get("InvalidPayload", 0) + 1
                        add(prepared)
                        flush()
                        continue
                    while len(in_flight) >= self.max_concurrency:
                        in_flight = wait_some(in_flight)
                    if stop.is_set():
                        break
                    in_flight.add(pool.submit(self._send, prepared, limiter, deadline, stop))
                while in_flight:
                    in_flight = wait_some(in_flight)
            except BaseException:
                # Record the sends that completed before letting the exception out, so none is
                # sent again after the lease expires. Every send in flight ends within the
                # client's timeouts (see create_ses_client).
                stop.set()
                try:
                    done, _ = wait(in_flight)
                    absorb(done)
                    flush(force=True)
                except Exception as exc:
                    log.exception("could not record completed SES sends after an error",
                                  extra={"error_type": type(exc).__name__})
                raise
            finally:
                stop.set()  # whatever happened, start nothing more; the pool waits for calls in flight
        if quota_hit.is_set() and not failure:
            for m in messages:
                if m.seq not in reported:
                    add(DeliveryResult(m.seq, error_class=ErrorClass.THROTTLED,
                                       error="ses: not sent: the daily sending quota is used up",
                                       retry_after_seconds=self.quota_deferral_seconds))
        flush(force=True)
        log.info("ses batch done", extra={"sent": tally.sent, "failed": tally.failed,
                                          "not_started": tally.not_started, "rate_used": limiter.rate})
        if failure:
            raise failure[0]

    def _prepare(self, m: ClaimedMessage) -> _Prepared | DeliveryResult | None:
        """The SendEmail request of one message; a PERMANENT result when its stored
        payload is invalid or cannot be written as MIME (the error names the field);
        None when it has no sender and none is configured. Anything else it raises
        is a bug of ours (the caller retries the message)."""
        try:
            return self._prepare_payload(m, load_payload(m.payload_json))
        except InvalidMessageError as exc:
            return DeliveryResult(m.seq, error_class=ErrorClass.PERMANENT, error=f"ses: {exc}")

    def _prepare_payload(self, m: ClaimedMessage, payload: EmailPayload) -> _Prepared | DeliveryResult | None:
        sender = payload.sender or self.default_sender
        if sender is None:
            return None
        config_set = payload.configuration_set or self.default_configuration_set
        with _content_field("from"):
            from_address = encode_address(sender)
        with _content_field("to"):
            destination = {k: [encode_address(a) for a in v] for k, v in
                           (("ToAddresses", payload.to), ("CcAddresses", payload.cc),
                            ("BccAddresses", payload.bcc)) if v}
        request: dict[str, Any] = {
            "FromEmailAddress": from_address,
            "Destination": destination,
            "EmailTags": [{"Name": OUTBOX_TAG, "Value": m.message_id}]
                         + [{"Name": k, "Value": v} for k, v in payload.tags.items()],
        }
        if payload.reply_to:
            with _content_field("reply_to"):
                request["ReplyToAddresses"] = [encode_address(a) for a in payload.reply_to]
        if config_set:
            request["ConfigurationSetName"] = config_set
        if payload.attachments or (payload.headers and not self._simple_headers):
            raw = build_mime(payload, sender=sender)
            if len(raw) > MAX_MESSAGE_BYTES:
                return DeliveryResult(m.seq, error_class=ErrorClass.PERMANENT,
                                      error=f"ses: the message is {len(raw)} bytes as MIME; SES v2 accepts at "
                                            f"most {MAX_MESSAGE_BYTES}")
            request["Content"] = {"Raw": {"Data": raw}}
        else:
            with _content_field("headers"):
                request["Content"] = {"Simple": _simple_content(payload)}
        with _content_field("from"):
            own_sender = address_of(payload.sender) if payload.sender else None
            mailboxes = _mailboxes(payload, sender)
            _redactions(mailboxes)  # parses every address again; fails here, not in a worker
        return _Prepared(
            seq=m.seq, request=request, cost=len(payload.recipients), own_sender=own_sender,
            own_configuration_set=payload.configuration_set, mailboxes=mailboxes,
        )

    def _send(self, p: _Prepared, limiter: SendRateLimiter, deadline: Deadline, stop: threading.Event) -> _Attempt:
        """Worker thread: wait for the paced slot, send, classify. Never raises."""
        try:
            if not limiter.acquire(p.cost, seconds_left=deadline.seconds_left, wait=stop.wait):
                return _Attempt(p.seq, Verdict.NOT_STARTED)
            if stop.is_set() or deadline.passed():
                return _Attempt(p.seq, Verdict.NOT_STARTED)
            try:
                response = self.client.send_email(**p.request)
            except Exception as exc:  # classified below; nothing escapes a worker
                c, code = classify_exception(
                    exc, own_sender=p.own_sender, own_configuration_set=p.own_configuration_set,
                    default_sender=self.default_sender_address,
                    default_configuration_set=self.default_configuration_set)
                text = f"ses {code}: {_redact(_exception_message(exc), _redactions(p.mailboxes))}"
                retry_after = self.quota_deferral_seconds if c.verdict is Verdict.QUOTA else None
                result = DeliveryResult(p.seq, error_class=c.error_class, error=text,
                                        retry_after_seconds=retry_after)
                return _Attempt(p.seq, c.verdict, result, code, text)
            return _Attempt(p.seq, Verdict.DELIVERED, DeliveryResult(p.seq, delivery_ref=response["MessageId"]))
        except Exception as exc:  # a bug of ours: retry the message later, keep the batch going
            log.exception("unexpected error in an SES send worker", extra={"error_type": type(exc).__name__})
            return _Attempt(p.seq, Verdict.MESSAGE,
                            DeliveryResult(p.seq, error_class=ErrorClass.TRANSIENT,
                                           error=f"ses: unexpected error ({type(exc).__name__})"),
                            type(exc).__name__)


def _content_field(field: str) -> Any:
    """`field_errors` for turning the message's own values into the request: an
    exception becomes `InvalidMessageError(field, …)` (the message's fault:
    PERMANENT), naming the exception type only."""
    return field_errors(field, "cannot be encoded for SES")


def _simple_content(payload: EmailPayload) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if payload.text is not None:
        body["Text"] = {"Data": payload.text, "Charset": "UTF-8"}
    if payload.html is not None:
        body["Html"] = {"Data": payload.html, "Charset": "UTF-8"}
    simple: dict[str, Any] = {"Subject": {"Data": payload.subject, "Charset": "UTF-8"}, "Body": body}
    if payload.headers:
        simple["Headers"] = [{"Name": k, "Value": encode_header_value(v)} for k, v in payload.headers.items()]
    return simple


def _supports_simple_headers(client: Any) -> bool:
    """Whether this botocore knows ``Message.Headers`` (added to SES v2 in 2024);
    older ones get custom headers through raw MIME instead."""
    try:
        return "Headers" in client.meta.service_model.shape_for("Message").members
    except Exception:
        return False


def _mailboxes(payload: EmailPayload, sender: str) -> tuple[tuple[str, str], ...]:
    return tuple((role, a) for role, items in (("from", (sender,)), ("to", payload.to), ("cc", payload.cc),
                                               ("bcc", payload.bcc), ("reply_to", payload.reply_to))
                 for a in items)


def _redactions(mailboxes: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """(text form, label) pairs for every way an address may appear in an error, longest first."""
    pairs = {(form, f"<{role}>") for role, a in mailboxes for form in (a, address_of(a), encode_address(a))}
    return tuple(sorted(pairs, key=lambda p: -len(p[0])))


def _redact(text: str, redactions: tuple[tuple[str, str], ...]) -> str:
    """Remove the message's addresses from an SES error text (stored errors must
    not echo the payload); any other address-like token becomes ``<address>``."""
    for form, label in redactions:
        if form:
            text = re.sub(re.escape(form), label, text, flags=re.IGNORECASE)
    text = _ANY_ADDRESS.sub("<address>", text)
    return text[:MAX_ERROR_TEXT]


def _exception_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Message") or "")
    return str(exc)


def ses_timeouts(deadline_margin_seconds: float) -> tuple[float, float]:
    """The SES client's (connect, read) timeouts, seconds, for a deadline margin
    (OUTBOX_DEADLINE_MARGIN_SECONDS, seconds): connect `CONNECT_TIMEOUT_SECONDS`
    (2 s), read ``margin - connect - RECORD_RESERVE_SECONDS`` (margin − 3 s),
    at least 1 s and at most 15 s. With the default 5 s margin: 2 s and 2 s.

    The invariant this serves: no send starts once the time left is below the
    margin (`SendRateLimiter.acquire` and the check before ``SendEmail``), the SDK
    does not retry (``total_max_attempts`` 1), and one attempt can last at most
    connect + read ≤ margin − 1 s; so a send started before the margin always
    completes or times out before the deadline, leaving at least
    `RECORD_RESERVE_SECONDS` to record it (a timeout is TRANSIENT: attempt counted,
    retried with backoff). botocore's read timeout bounds each wait for the socket
    (urllib3), not the whole response; a ``SendEmail`` response is one small body.
    Uploading a very large raw message over a slow link is bounded per write the
    same way, not in total.

    Raises `ConfigurationError` naming OUTBOX_DEADLINE_MARGIN_SECONDS when it is
    below `MIN_DEADLINE_MARGIN_SECONDS` (4 s): no sane timeouts fit.
    """
    if deadline_margin_seconds < MIN_DEADLINE_MARGIN_SECONDS:
        raise ConfigurationError(
            "OUTBOX_DEADLINE_MARGIN_SECONDS",
            f"is {deadline_margin_seconds:g}s; the SES relay needs at least {MIN_DEADLINE_MARGIN_SECONDS:g}s "
            f"({CONNECT_TIMEOUT_SECONDS:g}s connect + {MIN_READ_TIMEOUT_SECONDS:g}s read timeout + "
            f"{RECORD_RESERVE_SECONDS:g}s to record), so a send started before the margin ends before the deadline")
    read = deadline_margin_seconds - CONNECT_TIMEOUT_SECONDS - RECORD_RESERVE_SECONDS
    return CONNECT_TIMEOUT_SECONDS, min(MAX_READ_TIMEOUT_SECONDS, max(MIN_READ_TIMEOUT_SECONDS, read))


def create_ses_client(*, max_concurrency: int = 8, deadline_margin_seconds: float = 5.0,
                      connect_timeout_seconds: float | None = None,
                      read_timeout_seconds: float | None = None) -> Any:
    """A boto3 ``sesv2`` client for the whole container: connection pool as large
    as the send concurrency, SDK retries off (see the module docstring), connect
    and read timeouts (seconds) from `ses_timeouts(deadline_margin_seconds)`
    unless given, so every send ends inside the deadline margin.

    The endpoint follows the SDK's configuration: ``AWS_ENDPOINT_URL_SESV2`` (or
    ``AWS_ENDPOINT_URL``) points it at a local moto server ("AWS SDKs and Tools
    Reference Guide", service-specific endpoints). Raises `ConfigurationError`
    when no region is configured.
    """
    import boto3
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    connect, read = ses_timeouts(deadline_margin_seconds)
    connect_timeout_seconds = connect if connect_timeout_seconds is None else connect_timeout_seconds
    read_timeout_seconds = read if read_timeout_seconds is None else read_timeout_seconds
    config = Config(retries={"mode": "standard", "total_max_attempts": 1},
                    max_pool_connections=max(10, max_concurrency),
                    connect_timeout=connect_timeout_seconds, read_timeout=read_timeout_seconds,
                    user_agent_extra="outbox-relay")
    try:
        return boto3.session.Session().client("sesv2", config=config)
    except NoRegionError:
        raise ConfigurationError("AWS_DEFAULT_REGION", "no AWS region is configured for the SES client "
                                 "(Lambda sets it; set it for local runs)") from None


def build_ses_publisher(settings: Any, client: Any | None = None) -> SesPublisher:
    """The SES publisher for `settings` (OUTBOX_SES_*), with a new client unless one is given.

    Raises `ConfigurationError` naming OUTBOX_SES_FROM or OUTBOX_SES_CONFIGURATION_SET
    when they are malformed, or OUTBOX_DEADLINE_MARGIN_SECONDS when it is below
    `MIN_DEADLINE_MARGIN_SECONDS` (see `ses_timeouts`).
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
    if config_set is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", config_set):
        raise ConfigurationError("OUTBOX_SES_CONFIGURATION_SET",
                                 "must be 1-64 ASCII letters, digits, '_' or '-'")
    return SesPublisher(
        client if client is not None else create_ses_client(max_concurrency=settings.ses_max_concurrency,
                                                            deadline_margin_seconds=margin),
        default_sender=default_sender,
        default_configuration_set=config_set,
        max_concurrency=settings.ses_max_concurrency,
        record_group_size=settings.ses_record_group_size,
        quota_deferral_seconds=settings.ses_quota_deferral_seconds,
        max_send_rate=settings.ses_max_send_rate,
    )
