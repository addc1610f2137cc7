"""A process-wide budget for what forward readers hold read ahead.

A forward reader may read the log a span at a time (``ForwardReader``'s ``readahead_bytes``) and
hand the span out in smaller pieces: one index lookup, one ``pread`` and one vectorised CRC pass
per span. What it has read but not handed out is memory the reader holds while its caller is
away, and a caller may be away for good: a subscriber that stopped reading keeps its
subscription's reader, and with it the rest of a span, for as long as it stays connected.

So the bytes held ahead are leased from one budget (:data:`READAHEAD`, :data:`BUDGET_BYTES`):
a reader reads a span ahead only with a :class:`Lease` for it, and reads piece by piece when the
budget is spent. A lease is given back when its reader has handed the span out or is dropped
(the lease is released when the last reference to it goes: a subscription that ends returns its
lease without any call). Invariant: the bytes on lease never exceed the budget, so readers hold
at most :data:`BUDGET_BYTES` ahead in total, however many there are.
"""

from __future__ import annotations

import threading
from typing import Final

BUDGET_BYTES: Final = 16 << 20
"""At most this much read ahead in a process, over all readers (a catching-up subscription reads
1 MiB at a time: 16 of them read ahead at once, the rest piece by piece)."""


class ReadAheadBudget:
    """Bytes that readers may hold read ahead; thread-safe."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._leased = 0
        self._lock = threading.Lock()

    @property
    def leased(self) -> int:
        """The bytes on lease now."""
        return self._leased

    def lease(self, size: int, keep_free: int = 0) -> Lease | None:
        """A lease of ``size`` bytes, or None when that would leave less than ``keep_free``
        of the budget unleased."""
        with self._lock:
            if self._leased + size + keep_free > self.budget_bytes:
                return None
            self._leased += size
        return Lease(self, size)

    def _give_back(self, size: int) -> None:
        with self._lock:
            self._leased -= size


class Lease:
    """``size`` bytes of a budget, given back by :meth:`release` or when the lease is dropped."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: ReadAheadBudget, size: int) -> None:
        self._budget: ReadAheadBudget | None = budget
        self.size = size

    def release(self) -> None:
        """Give the bytes back (once; later calls do nothing)."""
        budget, self._budget = self._budget, None
        if budget is not None:
            budget._give_back(self.size)

    def __del__(self) -> None:
        self.release()


READAHEAD: Final = ReadAheadBudget(BUDGET_BYTES)
"""The budget every forward reader of this process leases from."""
