"""The feedback function's work: each SES event of an SNS delivery recorded against its
message (docs/design.md, "SES feedback"). A database error propagates: SNS invokes the
function again, and recording is idempotent."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from pydantic import model_validator

from .. import observability as obs
from ..config import _load, settings_for
from ..db import create_relay_engine
from .events import IGNORED, FeedbackEvent, MalformedEvent, parse_records
from .hashing import address_hasher
from .store import FeedbackStore

#: Reputation counts per configuration set, for the bounce and complaint rate alarms.
REPUTATION_METRICS = {"send": "EmailSent", "bounce": "EmailBounced", "complaint": "EmailComplained"}


class FeedbackSettings(settings_for("ses")):  # type: ignore[misc]
    """The database, the addresses' key and OUTBOX_SES_SUPPRESSION (on unless false)."""

    relays: ClassVar[bool] = False

    @model_validator(mode="after")
    def _key(self) -> "FeedbackSettings":
        if not (self.ses_address_key or self.ses_address_key_secret_arn):
            raise ValueError("OUTBOX_SES_ADDRESS_KEY: set it or OUTBOX_SES_ADDRESS_KEY_SECRET_ARN: the feedback "
                             "keeps recipients as keyed hashes")
        return self


def load_feedback_settings(**overrides: object) -> FeedbackSettings:
    return _load(FeedbackSettings, overrides)  # type: ignore[return-value]


@dataclass(frozen=True)
class FeedbackDependencies:
    settings: FeedbackSettings
    store: FeedbackStore


@functools.cache
def get_dependencies() -> FeedbackDependencies:
    settings = load_feedback_settings()
    hasher = address_hasher(settings)
    store = FeedbackStore(create_relay_engine(settings), hasher, suppress=settings.ses_suppression is not False)
    return FeedbackDependencies(settings, store)


def reset() -> None:
    if get_dependencies.cache_info().currsize:
        get_dependencies().store.engine.dispose()
    get_dependencies.cache_clear()


def run_feedback(event: Any, context: Any, deps: FeedbackDependencies) -> dict[str, Any]:
    summary: dict[str, Any] = {"records": 0, "recorded": 0, "duplicates": 0, "unknown": 0, "ignored": 0,
                               "settled": 0, "in_flight": 0, "suppressed": 0, "refused": []}
    reputation: dict[tuple[str, str], int] = {}
    for parsed in parse_records(event):
        summary["records"] += 1
        if parsed is IGNORED:
            summary["ignored"] += 1
            continue
        if isinstance(parsed, MalformedEvent):
            summary["refused"].append(str(parsed))
            obs.logger.warning("feedback event refused", extra={"field": parsed.field, "problem": parsed.problem})
            continue
        assert isinstance(parsed, FeedbackEvent)
        done = deps.store.record(parsed)
        if not done.found:
            summary["unknown"] += 1
        elif not done.new:
            summary["duplicates"] += 1
            continue
        else:
            summary["recorded"] += 1
            summary["settled"] += int(done.settled)
            summary["in_flight"] += int(done.in_flight)
            summary["suppressed"] += done.suppressed
        metric = REPUTATION_METRICS.get(parsed.event_type)
        if metric and (parsed.event_type != "bounce" or parsed.suppress_reason):  # permanent bounces only
            key = (metric, parsed.configuration_set or "none")
            reputation[key] = reputation.get(key, 0) + 1
        obs.logger.info("feedback event recorded" if done.found else "feedback event for an unknown message",
                        extra={"event_type": parsed.event_type, "message_id": parsed.outbox_message_id,
                               "ses_message_id": parsed.ses_message_id, "settled": done.settled,
                               "in_flight": done.in_flight, "suppressed": done.suppressed})
    obs.ensure_namespace()
    for name, key in (("FeedbackRecorded", "recorded"), ("FeedbackDuplicate", "duplicates"),
                      ("FeedbackUnknownMessage", "unknown"), ("FeedbackSettled", "settled"),
                      ("FeedbackSuppressed", "suppressed")):
        obs.emit(name, summary[key])
    obs.emit("FeedbackRefused", len(summary["refused"]))
    for (metric, config_set), n in reputation.items():
        with single_metric(name=metric, unit=MetricUnit.Count, value=n, namespace=obs.metrics.namespace,
                           default_dimensions={"service": obs.SERVICE}) as m:
            m.add_dimension(name="configuration_set", value=config_set)
    return summary
