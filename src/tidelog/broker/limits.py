"""The operator's caps on what clients may create: streams, partitions per stream, views.

Pure checks (no I/O, no state of their own): the caller counts what exists — the broker its own
streams and views, a cluster its metadata — and a request beyond a cap raises
:class:`~tidelog.errors.LimitReached` naming the setting, before anything is created. Internal
streams (``__`` names) are the broker's own and never count. Consumer groups are capped by the
coordinator (``groups.py``), cursors per stream by the cursor store (``cursors.py``) and the
descriptors of views by the open-file budget (``descriptors.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from tidelog.broker.config import BrokerConfig, StreamConfig
from tidelog.errors import LimitReached, echo
from tidelog.wire import INTERNAL_PREFIX


def client_streams(names: Iterable[str]) -> int:
    """How many of ``names`` are client streams (what ``max_streams`` counts)."""
    return sum(1 for name in names if not name.startswith(INTERNAL_PREFIX))


def check_new_stream(
    limits: BrokerConfig, name: str, config: StreamConfig, existing_streams: int
) -> None:
    """``LimitReached`` when creating client stream ``name`` would pass ``max_streams`` (with
    ``existing_streams`` client streams already) or asks for more partitions than
    ``max_partitions_per_stream``."""
    if config.partitions > limits.max_partitions_per_stream:
        raise LimitReached(
            "max_partitions_per_stream",
            f"stream {echo(name)} asks for {config.partitions} partitions: at most "
            f"{limits.max_partitions_per_stream} per stream here",
        )
    if existing_streams >= limits.max_streams:
        raise LimitReached(
            "max_streams",
            f"stream {echo(name)} is not created: {existing_streams} streams exist, the most "
            f"this broker holds; delete one first",
        )


def check_new_view(limits: BrokerConfig, stream: str, view: str, existing_views: int) -> None:
    """``LimitReached`` when declaring ``view`` would pass ``max_views``."""
    if existing_views >= limits.max_views:
        raise LimitReached(
            "max_views",
            f"view {echo(view)} of stream {echo(stream)} is not declared: {existing_views} views "
            f"exist, the most this broker holds; drop one first",
        )
