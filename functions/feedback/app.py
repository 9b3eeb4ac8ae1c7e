"""Feedback function: SES events from the configuration set's SNS destination,
recorded against their outbox messages.

All logic lives in the `outbox_relay` layer (`outbox_relay.feedback.run`);
settings, the engine and the addresses' key are built once per container.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from outbox_relay.feedback.run import get_dependencies, run_feedback
from outbox_relay.observability import logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return run_feedback(event, context, get_dependencies())
