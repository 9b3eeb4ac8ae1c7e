"""Writing outbox rows by hand in tests, for states the producer API cannot make
(dead letters, expired leases, old deliveries, bad stored payloads).

A message is two rows since migration 0003: its body (message id, payload,
headers) in outbox_message_body, which owns `seq`, and its state in
outbox_message. `insert_rows` writes both from one SELECT, in one statement.
"""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import TextClause, text

# Empties the outbox as TRUNCATE ... RESTART IDENTITY would, but truncates only the tables and
# partitions written to (pages on disk): a TRUNCATE of every day's partition cost most of a test.
EMPTY = text("""
DO $empty$
DECLARE
    written text;
BEGIN
    SELECT string_agg(t.relid::regclass::text, ', ') INTO written
      FROM (SELECT relid FROM pg_partition_tree('outbox_message') UNION ALL
            SELECT relid FROM pg_partition_tree('outbox_message_body') UNION ALL
            SELECT relid FROM pg_partition_tree('outbox_message_history') UNION ALL
            SELECT unnest(ARRAY['outbox_poller', 'outbox_email_event', 'outbox_suppression']::regclass[])) t
     WHERE pg_relation_size(t.relid) > 0;
    IF written IS NOT NULL THEN
        EXECUTE 'TRUNCATE ' || written;
    END IF;
    PERFORM setval(pg_get_serial_sequence(s.t, s.c), 1, false)
       FROM (VALUES ('outbox_message_body', 'seq'), ('outbox_message_history', 'id'),
                    ('outbox_email_event', 'id')) AS s (t, c);
END $empty$""")


def insert_rows(select_sql: str, columns: Sequence[str]) -> TextClause:
    """An INSERT of the rows `select_sql` yields, bodies and states.

    `select_sql` must name its outputs: `message_id` (uuid), `payload` (JSON as
    text, json or jsonb) and each of `columns` (outbox_message columns other
    than seq, message_id and payload_bytes, which are filled in here).
    """
    cols = "".join(f", {c}" for c in columns)
    src_cols = "".join(f", src.{c}" for c in columns)
    return text(f"""
        WITH src AS MATERIALIZED ({select_sql}),
        body AS (
            INSERT INTO outbox_message_body (message_id, payload)
            SELECT message_id, CAST(CAST(payload AS text) AS json) FROM src
            RETURNING seq, message_id
        )
        INSERT INTO outbox_message (seq, message_id{cols}, payload_bytes)
        SELECT body.seq, src.message_id{src_cols}, octet_length(CAST(src.payload AS text))
          FROM src JOIN body ON body.message_id = src.message_id
    """)
