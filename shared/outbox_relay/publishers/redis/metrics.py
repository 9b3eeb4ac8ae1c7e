"""The Redis relay's own metrics (its publisher's `counters`), counts per invocation."""

NOT_REPLICATED = "NotReplicated"
MEMORY_FULL = "RedisMemoryFull"
STREAM_FULL = "StreamFull"
TRIMMED_UNACKNOWLEDGED = "TrimmedUnacknowledged"

METRICS = (NOT_REPLICATED, MEMORY_FULL, STREAM_FULL, TRIMMED_UNACKNOWLEDGED)
