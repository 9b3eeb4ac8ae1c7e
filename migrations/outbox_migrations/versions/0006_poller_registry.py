"""The poller registry: `outbox_poller`, one row per latency-mode invocation.

A poller registers when it starts, renews its registration while it runs and
marks when it left. The newest live poller of a channel is the one that stays;
an older one leaves once it sees it (docs/design.md, "The poller handover").
A registration that was not renewed has expired: its holder is dead, and its
leases may be taken over at once instead of when they expire.

- `gap_seconds`: seconds no poller of the channel was running before this one
  registered (NULL for a channel's first), measured by the database clock.
- `successor_requested_at`: when it started a successor itself (at most once).
- `taken_over_at`: when another poller found its registration expired and
  took its leases over.

Rows are kept a week (each registration purges its channel's older rows), so
`outbox stats` can show the last window without a poller. The table is new:
creating it holds no lock on the outbox.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE outbox_poller (
            owner                  text PRIMARY KEY,
            channel                text NOT NULL,
            started_at             timestamptz NOT NULL DEFAULT now(),
            seen_at                timestamptz NOT NULL DEFAULT now(),
            expires_at             timestamptz NOT NULL,
            deadline_at            timestamptz NOT NULL,
            left_at                timestamptz,
            successor_requested_at timestamptz,
            gap_seconds            float8,
            taken_over_at          timestamptz
        )
        """
    )
    # The newest registrations of a channel (who is polling, the last gap, the purge).
    op.execute("CREATE INDEX outbox_poller_channel_started_idx ON outbox_poller (channel, started_at)")
    # Renewed about once a second: room for HOT updates.
    op.execute("ALTER TABLE outbox_poller SET (fillfactor = 50)")


def downgrade() -> None:
    op.execute("DROP TABLE outbox_poller")
