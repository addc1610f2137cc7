"""The one seam between the fronts and what serves them (``contract.py`` has the promises).

The server builds one control when it starts: :class:`SingleBroker` for one broker, or
:class:`ClusterControl` for a broker of a cluster; every front (``tidelog.api``) holds it as a
:class:`Control` and never asks which it has. This package's face is the names below; the api
imports nothing else of it, and nothing of ``tidelog.cluster`` or ``tidelog.sites`` but their
faces, in the server that builds the control.
"""

from tidelog.control.clustered import ClusterControl
from tidelog.control.contract import (
    Advertised,
    BrokerInfo,
    Control,
    LeaderCall,
    PartitionInfo,
    StreamInfo,
    ViewProgress,
)
from tidelog.control.local import Forwarded, forwarded
from tidelog.control.single import NOT_A_CLUSTER, SingleBroker
from tidelog.control.site_host import ClusterSite, SiteHost

__all__ = [
    "NOT_A_CLUSTER",
    "Advertised",
    "BrokerInfo",
    "ClusterControl",
    "ClusterSite",
    "Control",
    "Forwarded",
    "LeaderCall",
    "PartitionInfo",
    "SingleBroker",
    "SiteHost",
    "StreamInfo",
    "ViewProgress",
    "forwarded",
]
