"""Clusters of brokers (issue 14, in progress): metadata on etcd, leader epochs, and later
replica fetch and ISR. Single-node without etcd stays the default; nothing here runs unless a
server is started with cluster settings. See ``docs/cluster.md``."""
