"""outbox-relay: a serverless transactional-outbox relay (PostgreSQL → Redis Streams, Amazon SES, SQS, SNS
and EventBridge).

The producer API, for application code inside its own SQLAlchemy transaction:
`enqueue_event`, `enqueue_events_bulk` and `enqueue_email`, and `enqueue_sqs`,
`enqueue_sns` and `enqueue_eventbridge`.
"""

from .producer import (
    enqueue_email,
    enqueue_event,
    enqueue_eventbridge,
    enqueue_events_bulk,
    enqueue_sns,
    enqueue_sqs,
)

__all__ = ["enqueue_email", "enqueue_event", "enqueue_eventbridge", "enqueue_events_bulk", "enqueue_sns",
           "enqueue_sqs"]
