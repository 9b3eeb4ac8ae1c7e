"""Names callers import from here: `run_batch`, one invocation in batch mode, and
what this module held before the invocation's loop (`modes`), one batch (`batch`)
and the summary (`summary`) had modules of their own."""

from __future__ import annotations

from .batch import Batch, RelayPolicy, to_outcome
from .models import Mode
from .modes import run_loop
from .publishers.base import Deadline, Publisher
from .store import Store
from .summary import COUNTERS, Summary

__all__ = ["COUNTERS", "Batch", "RelayPolicy", "Summary", "run_batch", "to_outcome"]


def run_batch(store: Store, publisher: Publisher, policy: RelayPolicy, deadline: Deadline, owner: str,
              summary: Summary | None = None) -> Summary:
    """One invocation in batch mode, whatever `policy.mode` says (`modes.run_loop`):
    claim, deliver and record in sequence, until a claim is the batch."""
    return run_loop(store, publisher, policy, deadline, owner, Mode.BATCH, summary=summary)
