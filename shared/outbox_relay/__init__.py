"""outbox-relay: a serverless transactional-outbox relay (PostgreSQL → Redis Streams, Amazon SES, SQS, SNS,
EventBridge and Kinesis).

The producer API, for application code inside its own SQLAlchemy transaction
(`outbox_relay.producer`): `enqueue(conn, channel=…, **fields)` for any registered
channel, each channel's named function (`enqueue_event`, `enqueue_email`, …), and
`enqueue_bulk` / `enqueue_events_bulk`.
"""

from . import producer as _producer

__all__ = [name for name in _producer.__all__ if name.startswith("enqueue")]
globals().update({name: getattr(_producer, name) for name in __all__})
