"""What the AWS batch channels share (docs/channels.md, "SQS, SNS and EventBridge"). A round
carries one message per key; the next goes once it was delivered."""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

from ..errors import DownstreamUnavailable, StopBatch
from ..models import ClaimedMessage, DeliveryResult, ErrorClass
from ..observability import logger as log
from .aws_client import GATE_INTERVAL_SECONDS
from .aws_entries import Answers, Entry
from .aws_errors import ErrorCodes, Verdict, classify_code
from .base import Deadline, Publisher, RecordResults

#: Completed calls' results wait at most this long to be recorded, seconds.
RECORD_INTERVAL_SECONDS = 1.0

@dataclass(slots=True)
class CallResult:
    results: list[DeliveryResult] = field(default_factory=list)
    #: Seqs whose entry was delivered.
    delivered: set[int] = field(default_factory=set)
    stop: str | None = None
    unavailable: str | None = None


class AwsBatchPublisher(Publisher):
    pipelined: ClassVar[bool] = True
    #: The service's name in reasons and errors ("sqs").
    service: ClassVar[str]
    entries_per_call: ClassVar[int] = 10
    bytes_per_call: ClassVar[int] = 256 * 1024
    codes: ClassVar[ErrorCodes]

    def __init__(self, client: Any, *, max_concurrency: int = 4,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.max_concurrency = max(1, int(max_concurrency))
        self._clock = clock
        self._pool: ThreadPoolExecutor | None = None
        self._gated_at: float | None = None
        self._gate_reason: str | None = None

    def entry(self, m: ClaimedMessage, entry_id: str) -> Entry | DeliveryResult:
        """The request entry of `m`, or the (permanent) result of a message that cannot be sent."""
        raise NotImplementedError

    def call(self, entries: Sequence[Entry]) -> Answers:
        raise NotImplementedError

    def probe(self) -> None:
        """The gate's cheap call; raises botocore's exceptions."""
        raise NotImplementedError

    def begin(self, deadline: Deadline) -> None:
        self._gated_at = None

    def gate(self) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        now = self._clock()
        if self._gated_at is not None and now - self._gated_at < GATE_INTERVAL_SECONDS:
            return self._gate_reason
        self._gated_at = now
        try:
            self.probe()
            self._gate_reason = None
        except ClientError as exc:
            code = (exc.response.get("Error") or {}).get("Code", "Unknown")
            self._gate_reason = f"{self.service} refused the gate's call ({code})"
        except BotoCoreError as exc:
            self._gate_reason = f"{self.service} unavailable ({type(exc).__name__})"
        return self._gate_reason

    def claim_limit(self, batch_size: int, seconds_available: float) -> int:
        return batch_size if seconds_available > 0 else 0

    def deliver(self, messages: Sequence[ClaimedMessage], deadline: Deadline, record: RecordResults) -> None:
        if not messages:
            return
        pending: list[Entry] = []
        refused: list[DeliveryResult] = []
        # A message refused before sending holds back only what follows it in its key.
        behind_refused: set[tuple[str, str]] = set()
        for m in messages:
            k = _key(m)
            if k in behind_refused:
                refused.append(self._not_attempted(m))
                continue
            e = self.entry(m, str(m.seq))
            if isinstance(e, DeliveryResult):
                refused.append(e)
                if k is not None:
                    behind_refused.add(k)
            else:
                pending.append(e)
        stopped: set[tuple[str, str]] = set()  # keys with a message not delivered
        if refused:
            record(refused)
        halt: str | None = None
        unavailable: str | None = None
        while pending and halt is None and unavailable is None:
            this_round, later, skipped = self._round(pending, stopped)
            if skipped:
                record(skipped)
            pending = later
            if not this_round:
                break
            outcome = self._run_round(this_round, deadline, record, stopped)
            if outcome is None:  # the deadline came: the rest is not reported
                return
            halt, unavailable = outcome
        if halt is not None:
            raise StopBatch(halt)
        if unavailable is not None:
            raise DownstreamUnavailable(unavailable)

    def _round(self, pending: list[Entry], stopped: set[tuple[str, str]]
               ) -> tuple[list[Entry], list[Entry], list[DeliveryResult]]:
        """This round's entries (each key's first and every keyless one), later ones, and stopped keys' ones."""
        now, later, skipped = [], [], []
        seen: set[tuple[str, str]] = set()
        for e in pending:
            k = _key(e.message)
            if k in stopped:
                skipped.append(self._not_attempted(e.message))
            elif k in seen:
                later.append(e)
            else:
                if k is not None:
                    seen.add(k)
                now.append(e)
        return now, later, skipped

    def _not_attempted(self, m: ClaimedMessage) -> DeliveryResult:
        return DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED,
                              error=f"{self.service}: not sent: an earlier message of its key was not delivered "
                                    "in this batch")

    def _calls(self, entries: list[Entry]) -> list[list[Entry]]:
        """Per destination (a call's entries share it), within the per-call limits, in seq order."""
        calls: list[list[Entry]] = []
        open_: dict[str, tuple[list[Entry], list[int]]] = {}
        for e in entries:
            chunk, size = open_.get(e.destination, (None, [0]))
            if chunk is None or len(chunk) >= self.entries_per_call or size[0] + e.size > self.bytes_per_call:
                chunk, size = [], [0]
                open_[e.destination] = (chunk, size)
                calls.append(chunk)
            chunk.append(e)
            size[0] += e.size
        return calls

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix=f"{self.service}-call")
        return self._pool

    def _run_round(self, entries: list[Entry], deadline: Deadline, record: RecordResults,
                   stopped: set[tuple[str, str]]) -> tuple[str | None, str | None] | None:
        """Run a round's calls, recording completed ones together (a crash resends at most one
        `RECORD_INTERVAL_SECONDS`): (stop reason, unavailable reason), None when the deadline came."""
        calls = self._calls(entries)
        by_seq = {e.message.seq: e.message for e in entries}
        pool = self._executor()
        running: set[Future[CallResult]] = set()
        halt = unavailable = None
        late = False
        unrecorded: list[DeliveryResult] = []
        first_done = 0.0
        i = 0
        while i < len(calls) or running:
            while i < len(calls) and len(running) < self.max_concurrency and halt is None and unavailable is None:
                if deadline.passed():
                    late = True
                    i = len(calls)
                    break
                running.add(pool.submit(self._send, calls[i], deadline))
                i += 1
            if not running:
                break
            wait_at_most = max(0.0, RECORD_INTERVAL_SECONDS - (self._clock() - first_done)) if unrecorded else None
            done, running = wait(running, timeout=wait_at_most, return_when=FIRST_COMPLETED)
            for f in done:
                result = f.result()
                for r in result.results:
                    m = by_seq[r.seq]
                    if r.seq not in result.delivered and m.key is not None:
                        stopped.add((m.destination, m.key))
                if result.results and not unrecorded:
                    first_done = self._clock()
                unrecorded += result.results
                halt = halt or result.stop
                unavailable = unavailable or result.unavailable
            if unrecorded and (self._clock() - first_done >= RECORD_INTERVAL_SECONDS or deadline.passed()):
                record(unrecorded)
                unrecorded = []
            if halt is not None or unavailable is not None:
                i = len(calls)  # start nothing more; the calls in flight finish and are recorded
        if unrecorded:
            record(unrecorded)
        if late and halt is None and unavailable is None:
            return None
        return halt, unavailable

    def _send(self, entries: list[Entry], deadline: Deadline) -> CallResult:
        """One call; a whole-call refusal that may be one entry's fault is retried entry by entry."""
        from botocore import exceptions as bx

        if deadline.passed():
            return CallResult()
        own = entries[0].own_destination
        try:
            answers = self.call(entries)
        except bx.ClientError as exc:
            err = exc.response.get("Error") or {}
            code = str(err.get("Code") or "Unknown")
            status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            sender = err.get("Type") == "Sender" or (status is not None and 400 <= status < 500)
            if any(code in e.chosen for e in entries):
                if len(entries) > 1:  # whose choice was refused: find out one entry at a time
                    return self._one_by_one(entries, deadline)
                return CallResult([self._failed(entries[0], ErrorClass.PERMANENT, code)])
            c = classify_code(self.codes, code, sender, own_destination=own, status=status)
            if c.verdict is Verdict.STOP:
                log.error(f"{self.service} refused the relay", extra={"error_code": code})
                return CallResult(stop=f"{self.service} refused the call ({code})")
            if c.error_class is ErrorClass.PERMANENT and len(entries) > 1:
                return self._one_by_one(entries, deadline)
            return CallResult([self._failed(e, c.error_class, code) for e in entries])
        except bx.ParamValidationError:
            if len(entries) > 1:
                return self._one_by_one(entries, deadline)
            return CallResult([self._failed(entries[0], ErrorClass.PERMANENT, "ParamValidationError")])
        except (bx.NoCredentialsError, bx.PartialCredentialsError, bx.NoRegionError) as exc:
            return CallResult(stop=f"{self.service}: {type(exc).__name__}")
        except (bx.EndpointConnectionError, bx.ConnectTimeoutError) as exc:
            # Not connected: nothing was sent; the service is unavailable, not the messages bad.
            return CallResult(unavailable=f"{self.service} unavailable ({type(exc).__name__})")
        except Exception as exc:  # noqa: BLE001 (a reply we could not read, a bug): nobody's verdict
            # Sent, no answer (or none we could read): it may have arrived; retried, the id dedupes.
            if not isinstance(exc, (bx.BotoCoreError, bx.ConnectionClosedError, OSError)):
                log.exception(f"{self.service} call failed unexpectedly", extra={"error_type": type(exc).__name__})
            return CallResult([self._failed(e, ErrorClass.TRANSIENT, type(exc).__name__) for e in entries])
        out = CallResult()
        for e in entries:
            ref, code, sender_fault = answers.get(str(e.message.seq), (None, "MissingResult", None))
            if ref is not None:
                out.results.append(DeliveryResult.delivered(e.message.seq, ref))
                out.delivered.add(e.message.seq)
                continue
            if code in e.chosen:
                out.results.append(self._failed(e, ErrorClass.PERMANENT, code or "Unknown"))
                continue
            c = classify_code(self.codes, code or "Unknown", sender_fault, own_destination=e.own_destination)
            if c.verdict is Verdict.STOP:
                out.stop = out.stop or f"{self.service} refused an entry ({code})"
                continue  # not reported: released with its attempt refunded
            out.results.append(self._failed(e, c.error_class, code or "Unknown"))
        return out

    def _one_by_one(self, entries: list[Entry], deadline: Deadline) -> CallResult:
        out = CallResult()
        for e in entries:
            one = self._send([e], deadline)
            out.results += one.results
            out.delivered |= one.delivered
            out.stop = out.stop or one.stop
            out.unavailable = out.unavailable or one.unavailable
            if out.stop or out.unavailable:
                break
        return out

    def _failed(self, e: Entry, error_class: ErrorClass, code: str) -> DeliveryResult:
        return DeliveryResult(e.message.seq, error_class=error_class, error=f"{self.service}: {code}")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _key(m: ClaimedMessage) -> tuple[str, str] | None:
    return None if m.key is None else (m.destination, m.key)
