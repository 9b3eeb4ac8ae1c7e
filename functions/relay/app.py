"""Relay function: one scheduled invocation claims, delivers and records one batch.

Channel (redis or ses) comes from OUTBOX_CHANNEL; all logic lives in the
`outbox_relay` layer. Dependencies are built once per container.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from outbox_relay.invocation import run_relay
from outbox_relay.observability import logger, metrics, tracer
from outbox_relay.runtime import get_dependencies


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return run_relay(event, context, get_dependencies())
