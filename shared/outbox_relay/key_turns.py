"""Per-key turns across the batches of one invocation (docs/design.md, "Per-key ordering")."""

from __future__ import annotations

from typing import Sequence

from .models import ClaimedMessage


class KeyTurns:
    """The keys whose messages this invocation did not deliver, so a later batch (claimed while
    they were in flight) does not publish past them. A claim that began after a failure's
    write committed saw it and keeps the key's order itself."""

    def __init__(self, *, skip_dead: bool = True) -> None:
        # Under skip a dead letter no longer holds its key; under block it does until redriven.
        self._skip_dead = skip_dead
        # Per key, each seq not delivered and the number of the write that recorded it.
        self._failed: dict[tuple[str, str], dict[int, int]] = {}
        self._written = self.committed = 0

    def next_write(self) -> int:
        self._written += 1
        return self._written

    def write_committed(self, number: int) -> None:
        self.committed = max(self.committed, number)

    def held(self, messages: Sequence[ClaimedMessage], epoch: int | None = None) -> set[tuple[str, str]]:
        """Keys behind an undelivered message whose write had not committed when the claim began."""
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
        """Undelivered (or dead, under block) holds its key."""
        if message.key is None:
            return
        k = (message.destination, message.key)
        if not delivered and not (dead and self._skip_dead):
            self._failed.setdefault(k, {})[message.seq] = write
        elif k in self._failed:
            self._failed[k].pop(message.seq, None)
            if not self._failed[k]:
                del self._failed[k]
