"""What a tidelog client and server agree on without importing each other.

The client (``tidelog.client``, the CLI, the console, Spark) and the server (``tidelog.api``, the
broker, the cluster, the sites) are separate layers that meet only on the wire; the values and
formats both ends must hold equal are written once, in this package, at the bottom of the layers:
it imports nothing of tidelog but the generated ``_proto`` and ``errors``.

- here: where a server listens, the largest frame, and the names tidelog reserves (internal
  streams and the headers of multi-site receive queues);
- ``columns``: the columnar batch codec of ``tidelog.v1`` (standard library only; numpy is loaded
  by the two functions that hand out numpy arrays, which only the server calls);
- ``browse_token``: the continuation token of a browse, which the server makes and reads and the
  CLI makes to start a read at an offset;
- ``arrow``: ``RecordBatch`` frames as Arrow record batches (needs pyarrow, the ``spark`` extra;
  importing ``tidelog.wire`` does not load it).

Importing this package loads neither numpy nor pyarrow, so a client that only publishes pays for
neither (``tests/cli/test_cli_imports.py``).
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

INTERNAL_PREFIX: Final = "__"
"""Stream names starting with it are tidelog's own (internal streams): clients may read them but
not create, write, pause or delete them."""
CURSORS_STREAM: Final = "__cursors"
"""The internal stream consumer cursors are kept in: each set appends a record keyed
``<cursor id>,<stream>,<partition>`` (value: the offset, 8 bytes big-endian) to the partition
chosen by CRC-32 of the key, which client and server compute alike; in a cluster that
partition's leader takes the call."""

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

# -- between brokers, and from a broker to a client ----------------------------------------------

FORWARDED: Final = "tidelog-forwarded"
"""Request metadata on a call one broker hands to another (a publish or a view query to a
partition's leader, a coordinator report to the controller, a site call to the site's gateway):
the receiver serves it itself and never hands it on."""
NOT_LEADER_KEY: Final = "tidelog-not-leader"
"""Trailing metadata of a refusal because the broker asked does not lead the partition: the
leader's broker id as that broker knows it (empty: none now). Whoever routes reads this key,
never the status text (which is Liftbridge's, for Liftbridge clients)."""
LEADER_EPOCH_KEY: Final = "tidelog-leader-epoch"
"""Trailing metadata beside :data:`NOT_LEADER_KEY`: that leader's epoch (-1: unknown)."""
CURSOR_UNSET_KEY: Final = "tidelog-cursor-unset"
"""Trailing metadata of a ``FetchCursor`` answered -1 because the cursor was never set: -1 is
also a value a cursor may hold (a Kafka group that committed offset 0 stores it), and a broker
that fetches a cursor from the leader of its partition must tell the two apart."""
