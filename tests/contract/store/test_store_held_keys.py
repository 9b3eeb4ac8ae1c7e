"""The store contract, several pollers: a claim behind keys other pollers hold
(decision 0067), run against every store as test_store_contract.py is."""

from __future__ import annotations

from outbox_relay.models import Outcome

LEASE = 30.0


def seqs(claim) -> list[int]:
    return [m.seq for m in claim.messages]


def test_a_claim_passes_the_keys_other_pollers_hold_and_takes_the_rest_oldest_first(harness) -> None:
    # Given five keys' messages interleaved, four each, then a sixth key's and two without a key,
    # and a poller holding each of the five keys' first message
    store = harness.make()
    held = {k: [] for k in "abcde"}
    for _ in range(4):
        for k in held:
            held[k] += harness.add(1, key=k)
    free = harness.add(3, key="z")
    keyless = harness.add(2)
    first = seqs(store.claim("p0", 5, LEASE))
    assert first == sorted(v[0] for v in held.values())

    # When other pollers claim
    got = seqs(store.claim("p1", 4, LEASE))
    more = seqs(store.claim("p2", 10, LEASE))

    # Then they take, oldest first, what no held key keeps back, passing the held keys' rows
    # without leasing or moving them: still pending and due
    assert got == free + keyless[:1] and more == keyless[1:]
    behind = [s for v in held.values() for s in v[1:]]
    assert all(harness.row(s)[0] == "pending" and harness.row(s)[3] for s in behind)
    # and once the holder's deliveries are recorded, the keys' next rows are anyone's, in their turn
    assert store.record("p0", [Outcome.delivered(s, f"ref-{s}") for s in first]).delivered == 5
    assert seqs(store.claim("p2", 5, LEASE)) == sorted(v[1] for v in held.values())
