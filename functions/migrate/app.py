"""Migration function: run by the template's SchemaMigration custom resource
when a stack is created or updated; applies the outbox schema migrations and
answers CloudFormation.

All logic lives in the migrations layer (`outbox_migrations.custom_resource`);
the engine is built once per container from the relay's database settings.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from outbox_migrations.custom_resource import get_dependencies, run_custom_resource
from outbox_relay.observability import logger, tracer


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return run_custom_resource(event, context, get_dependencies)
