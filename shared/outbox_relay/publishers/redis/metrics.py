"""Metrics only the Redis relay emits (its publisher's `counters`), per invocation,
dimension channel: messages not recorded delivered because fewer replicas than
OUTBOX_REDIS_WAIT_REPLICAS acknowledged them; claims refused because Redis memory
was full (or it answered OOM); messages held because their stream was at its
bound; entries trimmed that a consumer group had not acknowledged
(OUTBOX_REDIS_ON_FULL=trim). All counts."""

NOT_REPLICATED = "NotReplicated"
MEMORY_FULL = "RedisMemoryFull"
STREAM_FULL = "StreamFull"
TRIMMED_UNACKNOWLEDGED = "TrimmedUnacknowledged"

METRICS = (NOT_REPLICATED, MEMORY_FULL, STREAM_FULL, TRIMMED_UNACKNOWLEDGED)
