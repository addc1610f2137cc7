"""What a tidelog client and server agree on without importing each other.

The client (``tidelog.client``) and the server (``tidelog.api``) are separate layers that meet
only on the wire; the values both ends must hold equal are written once, here.
"""

from __future__ import annotations

from typing import Final

DEFAULT_HOST: Final = "127.0.0.1"
"""Where a server binds, and a client looks for one, when told nothing."""
DEFAULT_PORT: Final = 9292
"""The gRPC port a server listens on, and a client connects to, when told nothing."""
MAX_FRAME: Final = 64 << 20
"""The largest gRPC message either end sends or accepts: room for a 64 MiB message or a large
batch."""
RECEIVE_QUEUE_PREFIX: Final = "__lrq_recv."
"""Multi-site replication: a sink keeps what source site S sent for client name C in the
internal stream ``__lrq_recv.C.S``, which the client's routing listener reads."""
POSITION_HEADER: Final = "__position"
"""The header of each receive-queue record holding the entry's position at its source site
(8 bytes, big-endian)."""
KIND_HEADER: Final = "__kind"
"""The header of a receive-queue record that belongs to a snapshot: ``snapshot_start``,
``snapshot_entry`` or ``snapshot_end`` (a record without it is a delta)."""
SNAPSHOT_HEADER: Final = "__snapshot"
"""With ``KIND_HEADER``: the snapshot's id (8 bytes, big-endian)."""
SNAPSHOT_REQUESTS: Final = "__lrq_snapshot_requests"
"""Multi-site replication: the source site's stream of snapshot requests, one JSON record
``{"site": ID, "snapshot": N}`` each; the client's snapshot provider follows it."""
