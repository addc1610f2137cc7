"""Multi-site replication through routing queues (``docs/replication.md``).

A site is one tidelog deployment. An application hands the source site an opaque payload and the
sites it goes to; the payload is stored once in a shared send queue, tagged per destination, and
one sender session per remote site ships that site's entries, in order, exactly once, with a
snapshot sync when deltas alone cannot catch the site up.

The pieces, sans-IO cores first, each tested alone: the sender session's state table
(``sync_states.py``), negotiation (``negotiation.py``), the two ends of a transfer — the sink's
apply window and the sender's resend window (``windows.py``) — the send queue's record format
(``envelope.py``), the tag index (``tag_index.py``) and positions with the lifts a source learns
after losing its data (``positions.py``); on the broker, the site registry (``registry.py``), the
delta queue with its checks (``send_queue.py``, over its appends, reads and index in
``queue_*.py``), the sender per remote site (``sender.py``, over ``tidelog.v1/Replicate``, its
parts in ``sender_*.py``), the sink's exactly-once apply into receive queues (``sink.py``), the
snapshot sync (``snapshots.py``), the queue's release by acknowledgement and the tag index's
snapshot (``upkeep.py``, ``tag_index_file.py``), the site's state in a cluster
(``site_state.py``), status (``status.py``), and this site as one object (``local_site.py``).

This package's face is the names below: what the server that runs a site (``tidelog.control``)
and the front that serves its RPCs (``tidelog.api``) use. Nothing above imports a submodule.
"""

from tidelog.sites.local_site import LocalSite
from tidelog.sites.registry import Site
from tidelog.sites.routed import RoutedColumns, from_wire
from tidelog.sites.send_queue import DELTA_QUEUE, QUEUE_SEGMENT_BYTES, QueueRetention
from tidelog.sites.sink import SnapshotFrame, StreamSource
from tidelog.sites.windows import Framed

__all__ = [
    "DELTA_QUEUE",
    "QUEUE_SEGMENT_BYTES",
    "Framed",
    "LocalSite",
    "QueueRetention",
    "RoutedColumns",
    "Site",
    "SnapshotFrame",
    "StreamSource",
    "from_wire",
]
