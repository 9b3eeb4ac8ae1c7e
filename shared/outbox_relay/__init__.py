"""outbox-relay: a serverless transactional-outbox relay (PostgreSQL → Redis Streams, Amazon SES, SQS, SNS,
EventBridge and Kinesis).

The producer API, for application code inside its own SQLAlchemy transaction:
`enqueue_event`, `enqueue_events_bulk` and `enqueue_email`, and `enqueue_sqs`,
`enqueue_sns`, `enqueue_eventbridge` and `enqueue_kinesis`.
"""

from .producer import (
    enqueue_email,
    enqueue_event,
    enqueue_eventbridge,
    enqueue_events_bulk,
    enqueue_kinesis,
    enqueue_sns,
    enqueue_sqs,
)

__all__ = ["enqueue_email", "enqueue_event", "enqueue_eventbridge", "enqueue_events_bulk", "enqueue_kinesis",
           "enqueue_sns", "enqueue_sqs"]
