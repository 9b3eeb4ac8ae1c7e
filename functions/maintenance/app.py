"""Maintenance function: once a day, the retention purge and the backlog
metrics; on request, a redrive of dead letters.

All logic lives in the `outbox_relay` layer (`outbox_relay.maintenance`).
Settings and the engine are built once per container; this function needs
only the database, not the relay's downstream.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from outbox_relay.maintenance import get_dependencies, run_maintenance
from outbox_relay.observability import logger, metrics, tracer


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return run_maintenance(event, context, get_dependencies())
