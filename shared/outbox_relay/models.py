"""Rows, statuses and outcomes of the outbox, as plain immutable values."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Mapping, NamedTuple


class Mode(str, enum.Enum):
    """How much one invocation does (OUTBOX_MODE; docs/design.md, "Invocation modes")."""

    BATCH = "batch"  # one batch per invocation
    DRAIN = "drain"  # batches back to back while they come back full and time remains
    LATENCY = "latency"  # batches until the deadline, polling the idle interval when nothing is due


class OrderingOnDead(str, enum.Enum):
    """What a dead letter does to the later messages of its key (OUTBOX_ORDERING_ON_DEAD;
    docs/design.md, "Per-key ordering")."""

    SKIP = "skip"  # they go on: the key has a gap where the dead letter was
    BLOCK = "block"  # they wait until the dead letter is redriven or discarded


class Status(str, enum.Enum):
    """Lifecycle states of an outbox message (docs/design.md, "Message lifecycle")."""

    PENDING = "pending"  # waiting; claimable once `available_at <= now()`
    LEASED = "leased"  # claimed by `lease_owner` until `lease_expires_at`
    DELIVERED = "delivered"  # left the database; `delivery_ref` says where it landed
    DEAD = "dead"  # given up; `last_error` says why; an operator may redrive or discard it
    DISCARDED = "discarded"  # a dead letter an operator gave up on: it holds back no key


class ErrorClass(str, enum.Enum):
    """Why a delivery attempt did not succeed; stored in `last_error_class`."""

    TRANSIENT = "transient"  # network, 5xx, timeouts: retried with backoff
    PERMANENT = "permanent"  # the message's fault (bad payload, rejected): dead letter now
    THROTTLED = "throttled"  # downstream asked us to slow down: attempt refunded, deferred
    LEASE_EXPIRED = "lease_expired"  # a holder died or overran with no attempts left
    DOWNSTREAM_UNAVAILABLE = "downstream_unavailable"  # Redis down, SES paused: refunded
    CONFIGURATION = "configuration"  # our sender/identity/account is refused: stop the batch
    NOT_ATTEMPTED = "not_attempted"  # released before delivery (deadline, batch stopped)
    AMBIGUOUS = "ambiguous"  # the send's answer was lost: waits for SES feedback, else sent once more
    SUPPRESSED = "suppressed"  # a recipient is on the suppression list: dead letter, never sent


class OutcomeKind(str, enum.Enum):
    """What the relay records for one claimed message (one SQL statement per group)."""

    DELIVERED = "delivered"  # status delivered, delivery_ref stored
    RETRY = "retry"  # pending after a backoff delay; dead when attempts reached the maximum
    DEAD = "dead"  # dead letter now, error recorded
    RELEASE = "release"  # pending after `delay_seconds`, the claim's attempt refunded
    SETTLE = "settle"  # pending after `delay_seconds`, attempt kept, never dead here (an ambiguous send)


class ClaimedMessage(NamedTuple):
    """A claimed row, texts as the database wrote them (no UUID, JSON or time parsed on the hot
    path); a named tuple: a frozen dataclass's `__init__` costs a setattr per field per row."""

    seq: int
    message_id: str
    status: Status
    destination: str
    type: str
    key: str | None
    payload_json: str
    headers_json: str | None
    attempts: int
    max_attempts: int
    created_at: str


_new_tuple = tuple.__new__


class DeliveryResult(NamedTuple):
    """A publisher's report on one message: `delivery_ref` or `error_class`, and perhaps its own deferral."""

    seq: int
    delivery_ref: str | None = None
    error_class: ErrorClass | None = None
    error: str | None = None
    retry_after_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @classmethod
    def delivered(cls, seq: int, delivery_ref: str) -> "DeliveryResult":
        """Positional: a keyword call to a named tuple is several times slower, once per message."""
        return _new_tuple(cls, (seq, delivery_ref, None, None, None))


class Outcome(NamedTuple):
    """What to record for claimed message `seq`; `delay_seconds` from the database's `now()`."""

    seq: int
    kind: OutcomeKind
    error_class: ErrorClass | None = None
    error: str | None = None
    delivery_ref: str | None = None
    delay_seconds: float = 0.0

    @classmethod
    def delivered(cls, seq: int, delivery_ref: str | None) -> "Outcome":
        return _new_tuple(cls, (seq, OutcomeKind.DELIVERED, None, None, delivery_ref, 0.0))


@dataclass(frozen=True, slots=True)
class MessageRow:
    """A full outbox row, for operators (`outbox dead show`, `outbox stats`)."""

    seq: int
    message_id: uuid.UUID
    channel: str  # the schema takes any name (migration 0007)
    destination: str
    type: str
    key: str | None
    payload: Any
    headers: Mapping[str, Any] | None
    status: Status
    attempts: int
    max_attempts: int | None
    available_at: datetime
    lease_owner: str | None
    lease_expires_at: datetime | None
    last_error: str | None
    last_error_class: str | None
    delivery_ref: str | None
    created_at: datetime
    delivered_at: datetime | None
    dead_at: datetime | None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> "MessageRow":
        return cls(**{f.name: m[f.name] for f in fields(cls)} | {"status": Status(m["status"])})
