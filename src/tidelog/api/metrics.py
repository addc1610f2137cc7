"""Prometheus metrics, read from the broker's own counters at scrape time.

Per-stream message and byte counters, subscriber counts and partition sizes cost the hot paths
nothing: the collector walks the partitions when ``/metrics`` is scraped. Only publish latency is
observed per call (one histogram observation per publish request, not per message).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tidelog.broker import Broker
from tidelog.control import SiteHost

PUBLISH_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class BrokerCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        messages_in = CounterMetricFamily(
            "tidelog_messages_in", "Messages appended", labels=["stream"]
        )
        bytes_in = CounterMetricFamily(
            "tidelog_bytes_in", "Payload bytes appended", labels=["stream"]
        )
        messages_out = CounterMetricFamily(
            "tidelog_messages_out", "Messages delivered to subscribers", labels=["stream"]
        )
        bytes_out = CounterMetricFamily(
            "tidelog_bytes_out", "Record bytes delivered to subscribers", labels=["stream"]
        )
        subscribers = GaugeMetricFamily(
            "tidelog_subscribers", "Open subscriptions", labels=["stream", "partition"]
        )
        size = GaugeMetricFamily(
            "tidelog_partition_size_bytes", "Record bytes held", labels=["stream", "partition"]
        )
        newest = GaugeMetricFamily(
            "tidelog_partition_newest_offset", "Newest offset", labels=["stream", "partition"]
        )
        for stream in self.broker.list_streams():
            name = stream.name
            stats = [p.stats for p in stream.partitions]
            messages_in.add_metric([name], sum(s.messages_in for s in stats))
            bytes_in.add_metric([name], sum(s.bytes_in for s in stats))
            messages_out.add_metric([name], sum(s.messages_out for s in stats))
            bytes_out.add_metric([name], sum(s.bytes_out for s in stats))
            for p in stream.partitions:
                labels = [name, str(p.number)]
                subscribers.add_metric(labels, p.subscribers)
                newest.add_metric(labels, p.newest_offset)
                if not p.paused and not (p.deleted or p.closed):
                    size.add_metric(labels, p.log.size_bytes)
        yield from (messages_in, bytes_in, messages_out, bytes_out, subscribers, size, newest)


class SitesCollector(Collector):
    """Multi-site replication, per remote site (``tidelog.sites.status``): what ``tidelog site
    status`` shows, at scrape time."""

    def __init__(self, sites: SiteHost) -> None:
        self.sites = sites

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def gauge(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=["site"])

        lag = gauge("tidelog_site_lag_entries", "Entries for the site not acknowledged yet")
        lag_s = gauge("tidelog_site_lag_seconds", "Age of the oldest unacknowledged entry")
        acked = gauge("tidelog_site_acked_position", "Last position the site acknowledged")
        last_ack = gauge(
            "tidelog_site_last_ack_timestamp_seconds", "Unix time of the site's last ack (0: none)"
        )
        caught_up = gauge("tidelog_site_caught_up", "1 when nothing is outstanding and in sync")
        stalled = gauge(
            "tidelog_site_stalled", "1 when entries are outstanding and the site is not acking"
        )
        state = GaugeMetricFamily(
            "tidelog_site_state", "1 for the sender's current state", labels=["site", "state"]
        )
        local = self.sites.local  # on a cluster: only the broker that runs the site reports it
        for site in [] if local is None else local.status():
            labels = [site.site_id]
            lag.add_metric(labels, site.lag_entries)
            lag_s.add_metric(labels, site.lag_seconds)
            acked.add_metric(labels, site.acked)
            last_ack.add_metric(labels, site.last_ack_s or 0.0)
            caught_up.add_metric(labels, int(site.caught_up))
            stalled.add_metric(labels, int(site.stalled))
            state.add_metric([site.site_id, site.state.value], 1)
        yield from (lag, lag_s, acked, last_ack, caught_up, stalled, state)


class Metrics:
    """The server's registry: broker counters plus the publish latency histogram (served on the
    HTTP port by ``tidelog.api.http``)."""

    def __init__(self, broker: Broker) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(BrokerCollector(broker))
        self.publish_latency = Histogram(
            "tidelog_publish_latency_seconds",
            "Time from receiving a publish request to acknowledging it",
            labelnames=["api"],
            buckets=PUBLISH_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def add_sites(self, sites: SiteHost) -> None:
        """Export multi-site replication's per-site lag and state too."""
        self.registry.register(SitesCollector(sites))
