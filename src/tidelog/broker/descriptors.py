"""The broker's open-file budget (``open_files_max``), shared by segment files and view stores.

Segment files are opened and closed on demand by an LRU (``tidelog.log.filecache``); a view's
RocksDB stores stay open while the view exists (they follow the log). So views *reserve* their
descriptors here when they are declared or opened at start, and the segment cache gets what they
leave: its capacity is the budget minus the views' reservations. Views may reserve at most half
the budget, so segments always keep half.

A view of P partitions reserves P times :data:`VIEW_STORE_DESCRIPTORS` of its kind. Measured
(one store, Linux): a table store holds 6 descriptors with no table file (its info log, its
directory twice, its lock, manifest and write-ahead log), a window store 8 (two more column
families); each is charged two table files more. RocksDB is told ``max_open_files`` 20, its
minimum, so a store never keeps more than ten table files open: the charge is what a store
holds in steady state, the rest of ``ulimit -n`` (the server takes at most half of it for this
budget, ``open_files_capacity``) covers the peaks.

A new view that does not fit is refused with ``LimitReached`` naming ``open_files_max``
(declare). Views declared before are opened at start even past the views' half: an upgrade or a
lower ``open_files_max`` must not close views that served yesterday. The excess comes out of the
segment files' share, which keeps at least a quarter of the budget (:meth:`reserve_views`,
``declared``); the first view past the half logs one WARNING naming ``open_files_max`` and the
value to set. A declared view that does not fit even so is left closed with a WARNING (the
broker starts under any descriptor limit, and queries of that view answer the same refusal until
the budget is raised and the server restarted).
"""

from __future__ import annotations

import logging
from typing import Final

from tidelog.broker.partition_view import ViewKind
from tidelog.errors import LimitReached
from tidelog.log.filecache import MOST_PER_SEGMENT, FileCache

LOG = logging.getLogger("tidelog.broker.descriptors")

VIEW_STORE_DESCRIPTORS: Final = {ViewKind.TABLE: 8, ViewKind.WINDOW: 10}
"""What one partition's store of a view is charged (module docstring)."""


class DescriptorBudget:
    """``total`` descriptors: the segment cache ``files`` and the views' reservations."""

    def __init__(self, total: int, files: FileCache) -> None:
        self.total = total
        self.files = files
        self.views = 0
        """Descriptors the open views have reserved."""
        self._warned = False

    @property
    def views_max(self) -> int:
        return self.total // 2

    @property
    def declared_views_max(self) -> int:
        """What views declared before may hold at start: all but the segments' floor."""
        return self.total - max(self.total // 4, MOST_PER_SEGMENT)

    def reserve_views(self, count: int, what: str, *, declared: bool = False) -> None:
        """Reserve ``count`` descriptors for ``what`` (a view), or raise ``LimitReached``.
        ``declared``: a view declared before, opened at start, which may go past the views'
        half (module docstring)."""
        most = self.declared_views_max if declared else self.views_max
        if self.views + count > most:
            share = "half" if not declared else "all but a quarter"
            raise LimitReached(
                "open_files_max",
                f"{what} needs {count} descriptors and views hold {self.views} of the "
                f"{most} they may ({share} of the {self.total} open files): raise "
                f"open_files_max (and ulimit -n), or drop a view",
            )
        self.views += count
        self.files.set_capacity(self.total - self.views)
        if self.views > self.views_max and not self._warned:
            self._warned = True
            LOG.warning(
                "views declared before hold more descriptors than the %d they may (half of "
                "open_files_max = %d): %s opened anyway, taken from the segment files' share "
                "(down to %d); set open_files_max to at least twice what the views need (%d "
                "now, more for each view opened after this) and ulimit -n to twice that, or "
                "drop views; new views are refused until then",
                self.views_max,
                self.total,
                what,
                self.total - self.views,
                2 * self.views,
            )

    def release_views(self, count: int) -> None:
        self.views -= count
        self.files.set_capacity(self.total - self.views)
