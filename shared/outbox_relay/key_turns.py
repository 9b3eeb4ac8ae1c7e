"""Per-key turns across the batches of one invocation (docs/design.md, "Per-key
ordering"): which keys a batch must not publish because an earlier message of
theirs was not delivered."""

from __future__ import annotations

from typing import Sequence

from .models import ClaimedMessage


class KeyTurns:
    """The keys of this invocation's messages that were not delivered, so that a
    later batch does not publish what comes after them (docs/design.md, "Per-key
    ordering").

    A claim may take a key's next messages while its earlier ones are still ours
    in flight (claimed by an earlier batch of this invocation, not yet
    recorded). Batches are published one after another, so by then the earlier
    ones' outcomes are known: when one was not delivered, the later ones of its
    key are released, not published out of order. Only keys with a failure are
    kept, with every seq not delivered (not only the highest: a message given
    back untried and claimed again must still wait for an earlier failure).

    Outcome writes are numbered (`next_write`, `committed`): a batch whose claim
    began after a failure's write committed was claimed by a statement that saw
    it, and the claim itself keeps the key's order, so that failure does not hold
    the batch (nor, as claims come in order, any later one); another invocation
    may have delivered the failed message since.
    """

    def __init__(self, *, skip_dead: bool = True) -> None:
        # Under the skip policy a dead letter no longer holds its key back (the claim
        # lets its successors go too); under block it does until it is redriven.
        self._skip_dead = skip_dead
        # Per key, each seq not delivered and the number of the write that recorded it.
        self._failed: dict[tuple[str, str], dict[int, int]] = {}
        self._written = 0
        #: The number of the last outcome write that committed (they commit in order).
        self.committed = 0

    def next_write(self) -> int:
        self._written += 1
        return self._written

    def write_committed(self, number: int) -> None:
        self.committed = max(self.committed, number)

    def held(self, messages: Sequence[ClaimedMessage], epoch: int | None = None) -> set[tuple[str, str]]:
        """The keys of `messages` (in seq order) whose first message here comes after
        one of its key that this invocation did not deliver, in a write that had not
        committed when the claim of `messages` began (`epoch`: the committed count
        then; None: unknown, every failure holds)."""
        failed = self._failed
        if not failed:
            return set()
        if epoch is not None:
            self._forget_up_to(epoch)
        held, seen = set(), set()
        for m in messages:
            if m.key is None:
                continue
            k = (m.destination, m.key)
            if k in seen:
                continue
            seen.add(k)
            undelivered = failed.get(k)
            if undelivered and min(undelivered) < m.seq:
                held.add(k)
        return held

    def _forget_up_to(self, epoch: int) -> None:
        for k in [k for k, seqs in self._failed.items() if min(seqs.values()) <= epoch]:
            kept = {seq: w for seq, w in self._failed[k].items() if w > epoch}
            if kept:
                self._failed[k] = kept
            else:
                del self._failed[k]

    def note(self, message: ClaimedMessage, delivered: bool, dead: bool = False, *, write: int = 0) -> None:
        """What became of `message`, in outcome write number `write`: delivered, or not
        (retried or given back: it holds its key back), or dead (it holds its key back
        under block only)."""
        if message.key is None:
            return
        k = (message.destination, message.key)
        if not delivered and not (dead and self._skip_dead):
            self._failed.setdefault(k, {})[message.seq] = write
        elif k in self._failed:
            self._failed[k].pop(message.seq, None)
            if not self._failed[k]:
                del self._failed[k]
