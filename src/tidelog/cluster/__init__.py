"""Clusters of brokers (``docs/cluster.md``): metadata on etcd, the controller, replica fetch
and the ISR, leader epochs, consumer groups coordinated across brokers.

Single-node without etcd stays the default; nothing here runs unless a server is started with
cluster settings. One :class:`ClusterNode` per broker composes the pieces, one concern per
module, each stating its invariant: ``settings.py``, ``metadata.py`` (etcd), ``controller.py``
(elections, reassignments, ISR changes), ``reconcile.py`` (this broker's replicas follow the
metadata), ``roles.py`` (what a replica may serve), ``follower.py`` and ``serving.py`` (the two
ends of a replica fetch), ``replication.py`` (the leader's view of its followers),
``leader_epochs.py``, ``routing.py`` (who leads what, and calls handed to the leader),
``admin.py`` (create, delete, reassign, read-only, views), ``status.py`` and ``groups.py``.

This package's face is the names below: the server builds a node and ``tidelog.control`` drives
it; nothing above imports a submodule.
"""

from tidelog.cluster.metadata import ClusterView, PartitionState
from tidelog.cluster.node import ClusterNode
from tidelog.cluster.settings import (
    DEFAULT_ACK_TIMEOUT_S,
    DEFAULT_LEASE_TTL_S,
    DEFAULT_REPLICA_LAG_MAX_S,
    ClusterSettings,
)

__all__ = [
    "DEFAULT_ACK_TIMEOUT_S",
    "DEFAULT_LEASE_TTL_S",
    "DEFAULT_REPLICA_LAG_MAX_S",
    "ClusterNode",
    "ClusterSettings",
    "ClusterView",
    "PartitionState",
]
