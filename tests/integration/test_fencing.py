"""Fencing: an ack after the lease was taken over changes nothing and counts as lease lost."""

from outbox_relay.models import ErrorClass, Outcome, OutcomeKind


def test_late_ack_after_takeover_is_lease_lost(enqueue, store, rows, expire_leases):
    # Given A claimed a message and overran its lease, and B took it over
    enqueue(1)
    (m,) = store.claim("owner-a", 10, 30).messages
    expire_leases()
    assert store.claim("owner-b", 10, 30).requeued == 1  # a first expiry: back in the queue
    (taken,) = store.claim("owner-b", 10, 30).messages
    assert taken.seq == m.seq
    before = rows()[0]
    # When A finally records every kind of outcome for it
    for kind in OutcomeKind:
        result = store.record("owner-a", [Outcome(m.seq, kind, ErrorClass.TRANSIENT if kind is not OutcomeKind.DELIVERED
                                                  else None, "late", "1-1" if kind is OutcomeKind.DELIVERED else None)])
        # Then nothing is written, and the write counts as a lost lease
        assert (result.lease_lost, result.delivered, result.retried, result.dead, result.released) == (1, 0, 0, 0, 0)
        assert result.lost_seqs == (m.seq,)
    volatile = ("due_in", "lease_left")  # computed against now(), which moves
    after = rows()[0]
    assert {k: v for k, v in after.items() if k not in volatile} == \
        {k: v for k, v in before.items() if k not in volatile}
    # And B's ack still works
    assert store.record("owner-b", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="2-2")]).delivered == 1


def test_ack_after_own_expiry_but_before_takeover_still_counts(enqueue, store, rows, expire_leases):
    """The fence is the owner token, not the clock: an overrun without a takeover is still ours."""
    enqueue(1)
    (m,) = store.claim("owner-a", 10, 30).messages
    expire_leases()
    assert store.record("owner-a", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1-1")]).delivered == 1
    assert rows()[0]["status"] == "delivered"


def test_mixed_group_counts_only_the_lost_ones(enqueue, store, expire_leases, app_engine):
    from sqlalchemy import text

    enqueue(3)
    ms = store.claim("a", 10, 30).messages
    with app_engine.begin() as conn:  # one of them is taken over
        conn.execute(text("UPDATE outbox_message SET lease_owner = 'b' WHERE seq = :s"), {"s": ms[1].seq})
    result = store.record("a", [Outcome(m.seq, OutcomeKind.DELIVERED, delivery_ref="1-1") for m in ms])
    assert (result.delivered, result.lease_lost, result.lost_seqs) == (2, 1, (ms[1].seq,))
