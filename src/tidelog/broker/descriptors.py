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

A view that does not fit is refused with ``LimitReached`` naming ``open_files_max`` (declare),
or left closed with a WARNING (start: the broker starts under any descriptor limit, and queries
of that view answer the same refusal until the budget is raised and the server restarted).
"""

from __future__ import annotations

from typing import Final

from tidelog.broker.partition_view import ViewKind
from tidelog.errors import LimitReached
from tidelog.log.filecache import FileCache

VIEW_STORE_DESCRIPTORS: Final = {ViewKind.TABLE: 8, ViewKind.WINDOW: 10}
"""What one partition's store of a view is charged (module docstring)."""


class DescriptorBudget:
    """``total`` descriptors: the segment cache ``files`` and the views' reservations."""

    def __init__(self, total: int, files: FileCache) -> None:
        self.total = total
        self.files = files
        self.views = 0
        """Descriptors the open views have reserved."""

    @property
    def views_max(self) -> int:
        return self.total // 2

    def reserve_views(self, count: int, what: str) -> None:
        """Reserve ``count`` descriptors for ``what`` (a view), or raise ``LimitReached``."""
        if self.views + count > self.views_max:
            raise LimitReached(
                "open_files_max",
                f"{what} needs {count} descriptors and views hold {self.views} of the "
                f"{self.views_max} they may (half of the {self.total} open files): raise "
                f"open_files_max (and ulimit -n), or drop a view",
            )
        self.views += count
        self.files.set_capacity(self.total - self.views)

    def release_views(self, count: int) -> None:
        self.views -= count
        self.files.set_capacity(self.total - self.views)
