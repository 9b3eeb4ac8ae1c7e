"""Writing outbox rows by hand in tests, for states the producer API cannot make
(dead letters, expired leases, old deliveries, bad stored payloads).

A message is two rows since migration 0003: its body (message id, payload,
headers) in outbox_message_body, which owns `seq`, and its state in
outbox_message. `insert_rows` writes both from one SELECT, in one statement.
"""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import TextClause, text


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
