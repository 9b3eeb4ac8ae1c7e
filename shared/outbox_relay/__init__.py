"""outbox-relay: a serverless transactional-outbox relay (PostgreSQL → Redis Streams, Amazon SES).

The producer API, for application code inside its own SQLAlchemy transaction:
`enqueue_event`, `enqueue_events_bulk` and `enqueue_email`.
"""

from .producer import enqueue_email, enqueue_event, enqueue_events_bulk

__all__ = ["enqueue_email", "enqueue_event", "enqueue_events_bulk"]
