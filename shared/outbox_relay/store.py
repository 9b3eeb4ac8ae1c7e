"""The lease store: claim a batch, record outcomes, all fenced and on the database clock."""

from __future__ import annotations

import operator
import secrets
from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import Engine

from . import sql
from .db import run_with_retry
from .models import Channel, ClaimedMessage, Outcome, OutcomeKind


#: Default byte budget of one claim: 32 MiB of payload JSON text.
DEFAULT_BATCH_MAX_BYTES = 32 * 1024 * 1024


def lease_token(request_id: str) -> str:
    """A lease owner token unique to one invocation: the Lambda request id plus
    64 random bits. Never a stable worker or function name: a retried or
    duplicated invocation with the same request id must not pass the fence."""
    return f"{request_id}:{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class RecordResult:
    """What one outcome write did. `lease_lost` counts outcomes that matched no
    row we still hold (taken over after expiry, or redriven): nothing was written."""

    delivered: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    lease_lost: int = 0
    lost_seqs: tuple[int, ...] = ()
    #: Age in seconds of the channel's oldest due pending message (0 when none),
    #: read by the same statement; None when no statement ran.
    oldest_pending_age_seconds: float | None = None


class LeaseStore:
    """Claims and outcome writes for one channel, one statement each.

    `engine` must be an autocommit engine (see `db.create_relay_engine`);
    `default_max_attempts` applies to messages enqueued without their own.
    """

    def __init__(self, engine: Engine, channel: Channel, *, default_max_attempts: int, error_max_chars: int = 1000):
        self.engine = engine
        self.channel = channel
        self.default_max_attempts = default_max_attempts
        self.error_max_chars = error_max_chars

    def claim(self, owner: str, limit: int, lease_seconds: float,
              max_bytes: int = DEFAULT_BATCH_MAX_BYTES) -> list[ClaimedMessage]:
        """Claim up to `limit` messages for `lease_seconds` (seconds) under `owner`,
        stopping once the payloads' JSON text claimed reaches `max_bytes` (bytes; at
        least one message is always claimed).

        One statement: expired leases first, then due pending rows, oldest
        first, `FOR UPDATE SKIP LOCKED`. Returned messages with status DEAD were
        re-claimed with no attempts left and dead-lettered (`lease_expired`)
        by the same statement; the rest are LEASED to `owner`.
        """
        if limit <= 0:
            return []
        params = {
            "channel": self.channel.value,
            "limit": int(limit),
            "owner": owner,
            "lease_seconds": float(lease_seconds),
            "default_max_attempts": self.default_max_attempts,
            "max_bytes": int(max_bytes),
        }

        def work(conn):
            return conn.execute(sql.CLAIM, params).fetchall()

        rows = run_with_retry(self.engine, work)
        from_row = ClaimedMessage.from_row
        messages = [from_row(r) for r in rows]
        messages.sort(key=_seq_of)
        return messages

    def record(self, owner: str, outcomes: Sequence[Outcome]) -> RecordResult:
        """Write `outcomes` for messages leased to `owner`, in one statement.

        Fenced: a row is changed only while `status = 'leased' AND lease_owner
        = owner`; others are counted in `lease_lost` and left as they are.
        Error texts are truncated to `error_max_chars`. The same statement
        reads the channel's oldest pending age (seconds, as
        `oldest_pending_age_seconds` gives it, before this write).
        """
        if not outcomes:
            return RecordResult()
        cap = self.error_max_chars
        params = {
            "owner": owner,
            "channel": self.channel.value,
            "default_max_attempts": self.default_max_attempts,
            "seqs": array_literal([o.seq for o in outcomes]),
            "kinds": array_literal([o.kind.value for o in outcomes]),
            "error_classes": text_array_literal([o.error_class.value if o.error_class else None for o in outcomes]),
            "errors": text_array_literal([truncate(o.error, cap) for o in outcomes]),
            "refs": text_array_literal([o.delivery_ref for o in outcomes]),
            "delays": (array_literal([float(o.delay_seconds) for o in outcomes])
                       if any(o.delay_seconds for o in outcomes) else None),
        }

        def work(conn):
            return conn.execute(sql.RECORD_OUTCOMES, params).one()

        delivered, retried, dead, released, lost, oldest = run_with_retry(self.engine, work)
        lost_seqs = tuple(lost or ())
        return RecordResult(delivered, retried, dead, released, len(lost_seqs), lost_seqs, float(oldest))

    def release(self, owner: str, seqs: Sequence[int], *, delay_seconds: float = 0.0,
                error_class=None, error: str | None = None) -> RecordResult:
        """Give back messages not delivered, refunding the claim's attempt."""
        return self.record(owner, [Outcome(s, OutcomeKind.RELEASE, error_class, error, None, delay_seconds)
                                   for s in seqs])

    def oldest_pending_age_seconds(self) -> float:
        """Age in seconds of the oldest due pending message (0 when none), by the database clock."""
        return float(run_with_retry(
            self.engine, lambda c: c.execute(sql.OLDEST_PENDING_AGE, {"channel": self.channel.value}).scalar_one()
        ))


_seq_of = operator.attrgetter("seq")


def array_literal(values: Sequence[int | float | str]) -> str:
    """A PostgreSQL array literal of numbers or of words that need no quoting
    (outcome kinds), e.g. ``'{1,2,3}'``; cast it in SQL (`CAST(:x AS bigint[])`)."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array_literal(values: Sequence[str | None]) -> str | None:
    """A PostgreSQL text[] literal with every element quoted (so a text "null"
    stays text), None elements as NULL; None when every element is None.

    NUL characters, which PostgreSQL text cannot hold, are dropped."""
    if all(v is None for v in values):
        return None
    return "{" + ",".join(
        "NULL" if v is None else
        '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", "") + '"'
        for v in values
    ) + "}"


def truncate(text: str | None, limit: int) -> str | None:
    """Cut `text` to at most `limit` characters, marking the cut."""
    if text is None or len(text) <= limit:
        return text
    marker = f"… [truncated, {len(text)} chars]"
    return text[: max(0, limit - len(marker))] + marker
