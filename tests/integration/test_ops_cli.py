"""`outbox stats`, `dead list`, `dead show`, `redrive` and `purge` on a seeded
database: what each prints, and the rows afterwards."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, text

from outbox_tools.cli import common as cli_common
from outbox_tools.cli import main
from support.rows import insert_rows

SEED = insert_rows(
    """
    SELECT CAST(:message_id AS uuid) AS message_id, CAST(:channel AS text) AS channel,
           CAST(:destination AS text) AS destination, CAST(:type AS text) AS type,
           CAST(:payload AS text) AS payload, CAST(:status AS text) AS status, CAST(:key AS text) AS key,
           CAST(:attempts AS integer) AS attempts, CAST(:max_attempts AS integer) AS max_attempts,
           now() - make_interval(secs => CAST(:available_ago AS float8)) AS available_at,
           CAST(:lease_owner AS text) AS lease_owner,
           CASE WHEN :status = 'leased' THEN now() + make_interval(secs => CAST(:lease_left AS float8)) END
               AS lease_expires_at,
           CAST(:last_error AS text) AS last_error, CAST(:last_error_class AS text) AS last_error_class,
           CASE WHEN :status = 'delivered' THEN '1-0' END AS delivery_ref,
           CASE WHEN :status = 'delivered' THEN now() - make_interval(secs => CAST(:ago AS float8)) END
               AS delivered_at,
           CASE WHEN :status = 'dead' THEN now() - make_interval(secs => CAST(:ago AS float8)) END AS dead_at,
           now() - make_interval(secs => CAST(:ago AS float8) + 1) AS created_at
    """,
    ["channel", "destination", "type", "key", "status", "attempts", "max_attempts", "available_at", "lease_owner",
     "lease_expires_at", "last_error", "last_error_class", "delivery_ref", "delivered_at", "dead_at",
     "created_at"],
)


def seed(engine: Engine, status: str = "pending", *, channel: str = "redis", ago: float = 0.0,
         error_class: str | None = None, error: str | None = None, attempts: int = 0,
         payload: Any = None, available_ago: float = 0.0, lease_left: float = 60.0,
         max_attempts: int | None = None, type: str = "order.placed", key: str | None = None) -> uuid.UUID:
    """One row in `status`; `ago` seconds since it died / was delivered (database clock)."""
    mid = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(SEED, {
            "message_id": str(mid), "channel": channel, "destination": "orders", "type": type,
            "payload": json.dumps(payload if payload is not None else {"n": 1}), "status": status,
            "attempts": attempts, "max_attempts": max_attempts, "available_ago": float(available_ago),
            "lease_owner": "someone" if status == "leased" else None, "lease_left": float(lease_left),
            "last_error": error if error is not None else (f"{error_class} failure" if error_class else None),
            "last_error_class": error_class, "ago": float(ago), "key": key,
        })
    return mid


def row(engine: Engine, mid: uuid.UUID) -> dict | None:
    with engine.connect() as conn:
        r = conn.execute(text("SELECT *, available_at <= now() AS due FROM outbox_message WHERE message_id = :m"),
                         {"m": str(mid)}).first()
    return dict(r._mapping) if r is not None else None


def all_rows(engine: Engine) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text("SELECT * FROM outbox_message ORDER BY seq"))]


@pytest.fixture
def app_engine(database_url):
    """A pooled engine for seeding and reading rows (many small transactions)."""
    engine = create_engine(database_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def outbox(monkeypatch, database_url):
    """Run `outbox …` against this test's database; returns (exit code, output)."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, list(args), catch_exceptions=False)
        return result.exit_code, result.output

    return run


def run_json(outbox, *args: str) -> Any:
    code, out = outbox(*args, "--json")
    assert code == 0, out
    return json.loads(out)


# ---------------------------------------------------------------- help

def test_every_operations_command_has_help():
    for args in (["stats"], ["dead"], ["dead", "list"], ["dead", "show"], ["redrive"], ["purge"]):
        result = CliRunner().invoke(main, [*args, "--help"])
        assert result.exit_code == 0, args
        assert result.output.startswith("Usage: ") and " ".join(args) in result.output


# ---------------------------------------------------------------- stats

def test_stats_counts_per_channel_and_status(outbox, app_engine):
    # Given a mix of rows on both channels
    seed(app_engine, "pending", available_ago=120)          # due, waiting 120 s
    seed(app_engine, "pending")                              # due now
    seed(app_engine, "pending", available_ago=-3600)         # deferred (backoff)
    seed(app_engine, "leased", attempts=1)                   # being relayed
    seed(app_engine, "leased", attempts=1, lease_left=-5)    # its holder died
    for _ in range(3):
        seed(app_engine, "delivered", ago=30)
    seed(app_engine, "dead", ago=600, error_class="permanent")
    seed(app_engine, "dead", ago=5 * 3600, error_class="transient")
    seed(app_engine, "dead", ago=3 * 86400, error_class="transient")
    seed(app_engine, "pending", channel="ses", available_ago=30)
    before = all_rows(app_engine)

    # When an operator asks for statistics
    data = run_json(outbox, "stats")

    # Then every figure is there, per channel
    redis, ses = data["channels"]
    age = redis.pop("oldest_pending_age_seconds")
    # the three delivered a second after their commit, 30 s ago: within the 5-minute lag window
    assert redis.pop("delivery_lag_ms") == {"window_seconds": 300.0, "delivered": 3, "p50": 1000.0, "p99": 1000.0,
                                            "max": 1000.0}
    assert ses["delivery_lag_ms"] == {"window_seconds": 300.0, "delivered": 0, "p50": None, "p99": None, "max": None}
    assert redis == {"channel": "redis", "pending": 3, "due_now": 2, "leased": 2, "expired_leases": 1,
                     "delivered": 3, "dead": 3, "dead_last_hour": 1, "dead_last_day": 2, "discarded": 0,
                     "keys_waiting_for_retry": 0, "keys_behind_dead_letter": 0,
                     "bounced": 0, "complained": 0, "suppressed": 0, "ambiguous": 0}
    assert 120 <= age < 150
    assert (ses["channel"], ses["pending"], ses["due_now"], ses["dead"]) == ("ses", 1, 1, 0)
    assert 30 <= ses["oldest_pending_age_seconds"] < 60
    assert data["totals"]["pending"] == 4 and data["totals"]["oldest_pending_age_seconds"] == age
    # And the human table shows the same
    code, out = outbox("stats")
    assert code == 0
    line = next(li for li in out.splitlines() if " redis " in li)
    assert [c.strip() for c in line.strip("│ ").split("│")][:9] == ["redis", "3", "2", "2", "1", "3", "3", "1", "2"]
    assert "2m " in line  # oldest pending, 2 minutes
    assert line.count(" 1.0s ") == 3  # lag p50, p99, max: in the same convention as the age
    assert " ms" not in out
    assert "delivery lag of the last 5m" in out
    assert any(" total " in li for li in out.splitlines())
    # And nothing changed
    assert all_rows(app_engine) == before


def test_stats_lag_window_takes_a_duration(outbox, app_engine):
    seed(app_engine, "delivered", ago=120)
    assert run_json(outbox, "stats", "--lag-window", "1m")["channels"][0]["delivery_lag_ms"]["delivered"] == 0
    assert run_json(outbox, "stats", "--lag-window", "3m")["channels"][0]["delivery_lag_ms"]["delivered"] == 1
    code, out = outbox("stats", "--lag-window", "soon")
    assert code == 2 and "--lag-window" in out


def test_stats_on_an_empty_outbox(outbox):
    data = run_json(outbox, "stats")
    # The day partitions the migration opened (docs/decisions/0066), the tables' sizes
    assert data.pop("partitions")["days"] > 0
    assert data == {"channels": [], "totals": {
        "pending": 0, "due_now": 0, "leased": 0, "expired_leases": 0, "delivered": 0, "dead": 0, "discarded": 0,
        "dead_last_hour": 0, "dead_last_day": 0, "keys_waiting_for_retry": 0, "keys_behind_dead_letter": 0,
        "bounced": 0, "complained": 0, "suppressed": 0, "ambiguous": 0,
        "oldest_pending_age_seconds": 0.0}, "pollers": []}
    assert outbox("stats") == (0, "the outbox is empty\n")


def test_stats_shows_the_pollers_live_now_and_the_last_window_without_one(outbox, app_engine, database_url):
    from outbox_relay.pollers import PollerRegistry
    from outbox_relay.publishers.registry import Channel

    # Given a poller that left, 0.4 s without one, then a poller polling now
    seed(app_engine, "pending")
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")  # as the relay's own
    registry = PollerRegistry(engine, Channel.REDIS, ttl_seconds=5)
    registry.register("first", 60)
    registry.leave("first")
    time.sleep(0.4)
    registry.register("second", 60)
    engine.dispose()

    # When an operator asks for statistics
    (pollers,) = run_json(outbox, "stats")["pollers"]
    code, text_out = outbox("stats")

    # Then the live poller and the window are there, in JSON and in the table
    assert pollers["channel"] == "redis" and pollers["live"] == 1
    assert 0.35 <= pollers["last_gap_seconds"] < 2.0 and 0 <= pollers["last_gap_ended_seconds_ago"] < 5
    assert code == 0 and "latency-mode pollers" in text_out
    assert f"{round(pollers['last_gap_seconds'] * 1000)}ms" in text_out or \
        f"{pollers['last_gap_seconds']:.1f}s" in text_out


def test_stats_chart_draws_each_channels_lag_over_the_window(outbox, app_engine):
    # Given deliveries over the last minute with known lags: redis 45 s ago (200 ms), two 30 s ago
    # (4 s and 1 s, in one slice), 10 s ago (50 ms); ses 20 s ago (300 ms); and one outside the window
    deliveries = [("redis", 45, 200), ("redis", 30, 4000), ("redis", 30, 1000), ("redis", 10, 50),
                  ("ses", 20, 300), ("redis", 90, 9000)]
    ids = [seed(app_engine, "delivered", channel=channel) for channel, _, _ in deliveries]
    with app_engine.begin() as conn:  # one statement, one now(): the two 30 s ago share their slice
        conn.execute(text("UPDATE outbox_message m SET delivered_at = now() - make_interval(secs => v.ago),"
                          " created_at = now() - make_interval(secs => v.ago) - make_interval(secs => v.lag / 1000.0)"
                          " FROM (SELECT unnest(CAST(:ids AS uuid[])) AS id, unnest(CAST(:agos AS float8[])) AS ago,"
                          " unnest(CAST(:lags AS float8[])) AS lag) v WHERE m.message_id = v.id"),
                     {"ids": [str(i) for i in ids], "agos": [float(a) for _, a, _ in deliveries],
                      "lags": [float(lag) for _, _, lag in deliveries]})

    # When an operator asks for the chart of the last minute
    chart = run_json(outbox, "stats", "--lag-window", "1m", "--chart")["lag_chart"]
    code, out = outbox("stats", "--lag-window", "1m", "--chart")

    # Then each channel's slices hold its deliveries, oldest first, the largest lag of each
    assert chart["bucket_seconds"] == 1.0
    redis, ses = chart["channels"]
    assert (redis["channel"], ses["channel"]) == ("redis", "ses")
    assert len(redis["max_ms"]) == len(redis["delivered"]) == 60
    assert [v for v in redis["max_ms"] if v is not None] == [200.0, 4000.0, 50.0]
    assert [n for n in redis["delivered"] if n] == [1, 2, 1]
    assert [v for v in ses["max_ms"] if v is not None] == [300.0] and sum(ses["delivered"]) == 1
    # the 45 s-old slice is about 15 slices into the minute (the command ran a little later)
    assert 13 <= redis["max_ms"].index(200.0) <= 15

    # And the terminal shows them in block characters within 80 columns, the 4 s column the tallest
    assert code == 0
    lines = out.splitlines()
    start = lines.index("redis: largest delivery lag per 1.0s of the last 1m 0s (4 delivered)")
    drawing = lines[start + 1:start + 9]
    assert all(len(li) <= 80 for li in lines[start:])
    assert drawing[0].startswith("    4.0s ┤") and drawing[0].count("█") == 1
    assert drawing[0].index("█") == 10 + redis["max_ms"].index(4000.0)
    assert "2.0s ┤" in drawing[3] and drawing[6].startswith("       0 └" + "─" * 60)
    assert drawing[7].split() == ["-1m", "0s", "now"] and drawing[7].endswith("now") and len(drawing[7]) == 70
    bottom = drawing[5][10:]
    assert sum(1 for c in bottom if c != " ") == 3  # three slices with a delivery, each at least ▁
    assert "ses: largest delivery lag per 1.0s of the last 1m 0s (1 delivered)" in lines
    assert "\x1b[" not in out  # no colour


def test_stats_chart_with_nothing_delivered_says_so(outbox, app_engine):
    seed(app_engine, "pending")
    code, out = outbox("stats", "--chart")
    assert code == 0 and out.rstrip().endswith("no delivery in the last 5m 0s: no lag to chart")
    assert run_json(outbox, "stats", "--chart")["lag_chart"] == {"bucket_seconds": 5.0, "channels": []}


# ---------------------------------------------------------------- dead list

@pytest.fixture
def dead_letters(app_engine) -> dict[str, uuid.UUID]:
    return {
        "redis_permanent_10m": seed(app_engine, "dead", ago=600, error_class="permanent", attempts=1),
        "redis_transient_2h": seed(app_engine, "dead", ago=7200, error_class="transient", attempts=10),
        "ses_permanent_1m": seed(app_engine, "dead", channel="ses", ago=60, error_class="permanent", attempts=1),
        "redis_lease_1d": seed(app_engine, "dead", ago=90000, error_class="lease_expired", attempts=10),
        "pending": seed(app_engine, "pending", error_class="transient", attempts=2),
    }


def test_dead_list_newest_first_with_filters(outbox, dead_letters, app_engine):
    d = {k: str(v) for k, v in dead_letters.items()}
    before = all_rows(app_engine)

    def ids(*args: str) -> list[str]:
        return [r["message_id"] for r in run_json(outbox, "dead", "list", *args)["dead"]]

    assert ids() == [d["ses_permanent_1m"], d["redis_permanent_10m"], d["redis_transient_2h"], d["redis_lease_1d"]]
    assert ids("--channel", "redis") == [d["redis_permanent_10m"], d["redis_transient_2h"], d["redis_lease_1d"]]
    assert ids("--error-class", "permanent") == [d["ses_permanent_1m"], d["redis_permanent_10m"]]
    assert ids("--since", "1h") == [d["ses_permanent_1m"], d["redis_permanent_10m"]]
    assert ids("--since", "PT3H", "--channel", "redis") == [d["redis_permanent_10m"], d["redis_transient_2h"]]
    assert ids("--limit", "1") == [d["ses_permanent_1m"]]
    # An ISO 8601 time (taken from the database clock) works too
    with app_engine.connect() as conn:
        three_hours_ago = conn.execute(text("SELECT now() - interval '3 hours'")).scalar_one()
    assert ids("--since", three_hours_ago.isoformat()) == ids("--since", "3h")

    listed = run_json(outbox, "dead", "list", "--channel", "ses")["dead"][0]
    assert listed["last_error_class"] == "permanent" and listed["attempts"] == 1
    assert 60 <= listed["dead_for_seconds"] < 90
    assert "payload" not in listed

    # Human output: a table with the ids and error classes
    code, out = outbox("dead", "list", "--error-class", "permanent")
    assert code == 0
    assert "dead letters (2)" in out and d["ses_permanent_1m"] in out and d["redis_permanent_10m"] in out
    assert d["redis_transient_2h"] not in out
    assert outbox("dead", "list", "--error-class", "configuration") == (0, "no dead letters match\n")
    assert all_rows(app_engine) == before


def test_dead_list_refuses_bad_options_by_name(outbox):
    for args, hint in [
        (["--since", "yesterday"], "--since"),
        (["--since", "2026-11-29T10:00:00"], "--since"),  # no zone
        (["--error-class", "bogus"], "--error-class"),
        (["--channel", "kafka"], "--channel"),
        (["--limit", "0"], "--limit"),
    ]:
        code, out = outbox("dead", "list", *args)
        assert code == 2 and hint in out, (args, out)


# ---------------------------------------------------------------- dead show

def test_dead_show_prints_payload_attempts_and_every_error_field(outbox, app_engine):
    mid = seed(app_engine, "dead", ago=120, error_class="permanent", attempts=3, max_attempts=5,
               error="redis: WRONGTYPE Operation against a key holding the wrong kind of value",
               payload={"order": 42, "items": ["a", "b"], "note": "größe"})
    data = run_json(outbox, "dead", "show", str(mid))
    assert data["message_id"] == str(mid) and data["status"] == "dead" and data["channel"] == "redis"
    assert data["payload"] == {"order": 42, "items": ["a", "b"], "note": "größe"}
    assert (data["attempts"], data["max_attempts"]) == (3, 5)
    assert data["last_error_class"] == "permanent"
    assert data["last_error"].startswith("redis: WRONGTYPE")
    assert data["dead_at"] is not None and data["delivered_at"] is None and data["lease_owner"] is None

    code, out = outbox("dead", "show", str(mid))
    assert code == 0
    assert "last_error_class  permanent" in out and "redis: WRONGTYPE" in out
    assert '"order": 42' in out and "größe" in out and "attempts          3" in out


def test_dead_show_unknown_or_malformed_id(outbox):
    code, out = outbox("dead", "show", str(uuid.UUID(int=7)))
    assert code == 1 and f"no message {uuid.UUID(int=7)}" in out
    code, out = outbox("dead", "show", "42x")
    assert code == 2 and "MESSAGE_ID" in out and "not a message id" in out


# ---------------------------------------------------------------- redrive

def assert_redriven(r: dict, *, last_error_class: str) -> None:
    assert r["status"] == "pending" and r["attempts"] == 0 and r["due"] is True
    assert r["dead_at"] is None and r["lease_owner"] is None
    assert r["last_error_class"] == last_error_class  # history kept for `dead show`


def test_redrive_by_ids(outbox, app_engine, dead_letters):
    d = dead_letters
    pending_before = row(app_engine, d["pending"])
    code, out = outbox("redrive", str(d["redis_permanent_10m"]), str(d["ses_permanent_1m"]), str(d["pending"]))
    assert code == 0
    assert "redrove 2 messages in 1 batch" in out
    assert "by channel: redis 1, ses 1" in out
    assert "1 id(s) were not dead letters" in out and str(d["pending"]) in out
    assert_redriven(row(app_engine, d["redis_permanent_10m"]), last_error_class="permanent")
    assert_redriven(row(app_engine, d["ses_permanent_1m"]), last_error_class="permanent")
    assert row(app_engine, d["redis_transient_2h"])["status"] == "dead"
    assert row(app_engine, d["pending"]) == pending_before  # not a dead letter: untouched


def test_redrive_by_channel_and_by_error_class(outbox, app_engine, dead_letters):
    d = dead_letters
    data = run_json(outbox, "redrive", "--channel", "ses")
    assert (data["moved"], data["by_channel"]) == (1, {"ses": 1})
    assert_redriven(row(app_engine, d["ses_permanent_1m"]), last_error_class="permanent")
    assert row(app_engine, d["redis_permanent_10m"])["status"] == "dead"

    data = run_json(outbox, "redrive", "--error-class", "transient")
    assert (data["moved"], data["by_error_class"]) == (1, {"transient": 1})
    assert_redriven(row(app_engine, d["redis_transient_2h"]), last_error_class="transient")
    assert row(app_engine, d["pending"])["attempts"] == 2  # a pending message with that class: untouched

    data = run_json(outbox, "redrive", "--channel", "redis", "--error-class", "lease_expired")
    assert data["moved"] == 1
    assert [r["message_id"] for r in all_rows(app_engine) if r["status"] == "dead"] == [d["redis_permanent_10m"]]


def test_redrive_all_in_batches_leaves_other_statuses_alone(outbox, app_engine):
    dead = [seed(app_engine, "dead", ago=60 + i, error_class="permanent", attempts=1) for i in range(25)]
    leased = seed(app_engine, "leased", attempts=1, error_class="permanent")
    delivered = seed(app_engine, "delivered", ago=10)
    others_before = [row(app_engine, leased), row(app_engine, delivered)]

    data = run_json(outbox, "redrive", "--all", "--batch-size", "10")

    assert (data["moved"], data["batches"]) == (25, 3)
    for mid in dead:
        assert_redriven(row(app_engine, mid), last_error_class="permanent")
    assert [row(app_engine, leased), row(app_engine, delivered)] == others_before


def test_redrive_dry_run_counts_and_changes_nothing(outbox, app_engine, dead_letters):
    before = all_rows(app_engine)
    code, out = outbox("redrive", "--channel", "redis", "--dry-run")
    assert code == 0
    assert "would redrive 3 messages" in out
    assert "by error class: lease_expired 1, permanent 1, transient 1" in out
    data = run_json(outbox, "redrive", "--all", "--dry-run")
    assert (data["dry_run"], data["moved"], data["by_channel"]) == (True, 4, {"redis": 3, "ses": 1})
    assert all_rows(app_engine) == before


def test_redrive_refuses_unclear_selections(outbox, app_engine, dead_letters):
    before = all_rows(app_engine)
    for args, fragment in [
        ([], "say what to redrive"),
        (["--all", "--channel", "redis"], "--all takes no MESSAGE_IDS, --channel or --error-class"),
        (["not-a-uuid"], "MESSAGE_IDS"),
        (["--error-class", "nope"], "--error-class"),
    ]:
        code, out = outbox("redrive", *args)
        assert code == 2 and fragment in out, (args, out)
    assert all_rows(app_engine) == before


# ---------------------------------------------------------------- purge

def test_purge_deletes_only_rows_past_their_window(outbox, app_engine):
    old_delivered = [seed(app_engine, "delivered", ago=10 * 86400) for _ in range(7)]
    recent_delivered = [seed(app_engine, "delivered", ago=86400) for _ in range(2)]
    old_dead = [seed(app_engine, "dead", ago=40 * 86400, error_class="permanent"),
                seed(app_engine, "dead", ago=40 * 86400, error_class="permanent"),
                seed(app_engine, "dead", channel="ses", ago=31 * 86400, error_class="permanent")]
    recent_dead = seed(app_engine, "dead", ago=86400, error_class="permanent")
    old_pending = seed(app_engine, "pending", available_ago=60 * 86400)
    leased = seed(app_engine, "leased", attempts=1)

    data = run_json(outbox, "purge", "--delivered-older-than", "7d", "--dead-older-than", "30d",
                    "--batch-size", "2")

    assert (data["delivered"], data["dead"], data["total"]) == (7, 3, 10)
    assert data["largest_batch"] <= 2 and data["batches"] >= 6  # 2+2+2+1 delivered, 2 redis + 1 ses dead
    assert data["by_channel"] == {"redis": 9, "ses": 1}
    left = {r["message_id"] for r in all_rows(app_engine)}
    assert left == {*recent_delivered, recent_dead, old_pending, leased}
    assert not left & {*old_delivered, *old_dead}
    with app_engine.connect() as conn:  # their bodies went with them
        bodies = {r[0] for r in conn.execute(text("SELECT message_id FROM outbox_message_body"))}
    assert bodies == left


def test_purge_human_output_and_dead_kept_without_a_dead_window(outbox, app_engine):
    for _ in range(3):
        seed(app_engine, "delivered", ago=2 * 3600)
    dead = seed(app_engine, "dead", ago=400 * 86400, error_class="permanent")
    code, out = outbox("purge", "--delivered-older-than", "1h30m")
    assert code == 0
    assert out.splitlines()[-1] == "purged 3 delivered messages in 1 batch"
    assert [r["message_id"] for r in all_rows(app_engine)] == [dead]


def test_purge_dry_run_counts_and_deletes_nothing(outbox, app_engine):
    for _ in range(4):
        seed(app_engine, "delivered", ago=8 * 86400)
    seed(app_engine, "dead", ago=8 * 86400, error_class="permanent")
    code, out = outbox("purge", "--delivered-older-than", "P7D", "--dead-older-than", "7d", "--dry-run")
    assert code == 0 and out == "would purge 4 delivered and 1 dead messages\n"
    assert len(all_rows(app_engine)) == 5


def test_purge_refuses_bad_durations_by_name(outbox, app_engine):
    seed(app_engine, "delivered", ago=8 * 86400)
    for args, hint in [
        (["--delivered-older-than", "a week"], "--delivered-older-than"),
        (["--delivered-older-than", "0s"], "--delivered-older-than"),
        (["--delivered-older-than", "7d", "--dead-older-than", "soon"], "--dead-older-than"),
        ([], "--delivered-older-than"),
    ]:
        code, out = outbox("purge", *args)
        assert code == 2 and hint in out, (args, out)
    assert len(all_rows(app_engine)) == 1


def test_long_operations_show_a_progress_bar_on_a_terminal(outbox, app_engine, monkeypatch):
    # Given standard output is a terminal
    monkeypatch.setattr(cli_common, "is_terminal", lambda: True)
    for _ in range(6):
        seed(app_engine, "delivered", ago=8 * 86400)
    for i in range(4):
        seed(app_engine, "dead", ago=60 + i, error_class="transient")
    # When a purge and a redrive run
    code, purge_out = outbox("purge", "--delivered-older-than", "7d", "--batch-size", "2")
    code2, redrive_out = outbox("redrive", "--all", "--batch-size", "3")
    # Then each draws a progress bar that reaches its total (rich), then the summary
    assert code == code2 == 0
    assert "purging" in purge_out and "6/6" in purge_out and "purged 6 delivered messages in 3 batches" in purge_out
    assert "redriving" in redrive_out and "4/4" in redrive_out and "redrove 4 messages in 2 batches" in redrive_out


# ---------------------------------------------------------------- keys held back, discard

def test_stats_shows_the_keys_held_back(outbox, app_engine):
    # Key a's first message waits for a retry; key b's comes after a dead letter; key c flows
    seed(app_engine, "pending", key="a", attempts=1, available_ago=-600)
    seed(app_engine, "pending", key="a")
    seed(app_engine, "dead", key="b", error_class="permanent")
    seed(app_engine, "pending", key="b")
    seed(app_engine, "pending", key="c")
    data = run_json(outbox, "stats")
    assert {k: data["channels"][0][k] for k in ("keys_waiting_for_retry", "keys_behind_dead_letter")} == {
        "keys_waiting_for_retry": 1, "keys_behind_dead_letter": 1}
    code, out = outbox("stats")
    line = next(li for li in out.splitlines() if " redis " in li)
    assert code == 0 and [c.strip() for c in line.strip("│ ").split("│")][10:12] == ["1", "1"]


def test_dead_discard_gives_up_dead_letters_and_brings_their_keys_back(outbox, app_engine):
    # Given a dead letter of key k and the key's next message, moved ahead while the key was held
    dead = seed(app_engine, "dead", key="k", error_class="permanent")
    held = seed(app_engine, "pending", key="k", available_ago=-60)
    other = seed(app_engine, "pending", key="other", available_ago=-60)
    pending = seed(app_engine, "pending")
    # When it is discarded, with ids that are not dead letters among those asked
    unknown = str(uuid.uuid4())
    result = run_json(outbox, "dead", "discard", str(dead), str(pending), unknown, str(dead), unknown)
    # Then only the dead letter changed, and its key's next message is due again; another key's is not
    # (an id given twice counts once)
    assert result["discarded"] == [str(dead)] and result["not_dead"] == [str(pending), unknown]
    assert row(app_engine, dead)["status"] == "discarded"
    assert row(app_engine, held)["due"] and not row(app_engine, other)["due"]
    assert row(app_engine, pending)["status"] == "pending"
    # And a second discard finds nothing to do; a bad id is refused by name
    assert run_json(outbox, "dead", "discard", str(dead))["discarded"] == []
    code, out = outbox("dead", "discard", "nope")
    assert code == 2 and "MESSAGE_IDS" in out


def test_a_redrive_of_a_discarded_id_says_it_may_be_discarded(outbox, app_engine):
    # Given a dead letter given up for good
    dead = seed(app_engine, "dead", error_class="permanent")
    run_json(outbox, "dead", "discard", str(dead))
    # When it is redriven by id, it is left alone, and the line says a discarded one is among what is left alone
    code, out = outbox("redrive", str(dead))
    assert code == 0 and "redrove 0 messages" in out
    assert "1 id(s) were not dead letters (unknown, or pending, leased, delivered, discarded)" in out and str(dead) in out
    assert row(app_engine, dead)["status"] == "discarded"


def test_a_redrive_brings_back_what_its_dead_letter_held(outbox, app_engine):
    dead = seed(app_engine, "dead", key="k", error_class="permanent")
    held = seed(app_engine, "pending", key="k", available_ago=-60)
    retrying = seed(app_engine, "pending", key="k", attempts=2, available_ago=-600)
    run_json(outbox, "redrive", str(dead))
    assert row(app_engine, dead)["status"] == "pending" and row(app_engine, dead)["due"]
    assert row(app_engine, held)["due"]
    assert not row(app_engine, retrying)["due"]  # a retry keeps its backoff


def test_purge_deletes_discarded_dead_letters_with_the_dead_retention(outbox, app_engine):
    old = seed(app_engine, "dead", ago=7200, error_class="permanent")
    young = seed(app_engine, "dead", ago=10, error_class="permanent")
    run_json(outbox, "dead", "discard", str(old), str(young))
    code, out = outbox("purge", "--delivered-older-than", "1d", "--dead-older-than", "1h", "--dry-run")
    assert code == 0 and out == "would purge 0 delivered and 1 dead messages\n"
    assert outbox("purge", "--delivered-older-than", "1d", "--dead-older-than", "1h")[0] == 0
    assert row(app_engine, old) is None and row(app_engine, young)["status"] == "discarded"


# ---------------------------------------------------------------- enqueue

def test_enqueue_event_with_deliver_at_waits_until_then(outbox, app_engine):
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
    code, out = outbox("enqueue-event", "--stream", "s", "--type", "t", "--payload", "{}", "--deliver-at", tomorrow)
    assert code == 0, out
    with app_engine.connect() as conn:
        status, due_in = conn.execute(text(
            "SELECT status, extract(epoch FROM available_at - now()) FROM outbox_message WHERE message_id = :m"),
            {"m": out.strip()}).one()
    # Not due: it waits for its time, a day from now
    assert status == "pending" and 86_000 < due_in <= 86_400
