"""``tidelog serve``: the broker behind a gRPC server, with health, metrics and graceful shutdown.

Shutdown on SIGTERM or SIGINT: subscriptions and open publish streams are ended (UNAVAILABLE,
"shutting down"; a publish stream first answers the requests it has read), the server stops
accepting calls and gives in-flight ones ``shutdown_grace_s`` to finish (acks for
publishes already appended go out), then every log is synced and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tidelog._proto.liftbridge import api_pb2_grpc
from tidelog._proto.tidelog.v1 import cluster_pb2_grpc, tidelog_pb2_grpc
from tidelog.api.credentials import ServerSecurity
from tidelog.api.decoding import GuardedRegistry
from tidelog.api.http import ConsoleFactory, HttpEndpoint
from tidelog.api.inflight import InFlight
from tidelog.api.liftbridge import LiftbridgeService
from tidelog.api.metrics import Metrics
from tidelog.api.replica_service import ClusterAdminService, ReplicationService
from tidelog.api.settings import ServerSettings
from tidelog.api.transport import NativeServer
from tidelog.api.v1 import TidelogService
from tidelog.broker import Broker
from tidelog.cluster import ClusterNode, ClusterSettings
from tidelog.control import Advertised, ClusterControl, ClusterSite, Control, SingleBroker, SiteHost
from tidelog.kafka import KafkaConfig, KafkaListener
from tidelog.security import ClientTls
from tidelog.security.scram import MECHANISM as SCRAM_MECHANISM
from tidelog.sites import QUEUE_SEGMENT_BYTES, LocalSite, QueueRetention, StreamSource
from tidelog.wire import MAX_FRAME

LOG = logging.getLogger("tidelog.server")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: ServerSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)


class Server:
    """A running tidelog server; ``await start()``, then ``await stop()``."""

    def __init__(self, settings: ServerSettings, *, console: ConsoleFactory | None = None) -> None:
        """``console``: builds the web console for the gRPC address, served at ``/`` on the
        metrics port beside ``/metrics``, or on ``console_port`` (``tidelog serve`` passes it
        unless ``console`` is off in the settings)."""
        self.settings = settings
        self.security = ServerSecurity(settings)
        self.broker = Broker(settings.broker_config())
        self.metrics = Metrics(self.broker)
        apart = console if settings.console_port else None
        self.http = HttpEndpoint(self.metrics.registry, None if apart else console, self.security)
        self.console_http: HttpEndpoint | None = None
        """The console's own port (``console_port``), apart from /metrics."""
        if apart is not None:
            self.console_http = HttpEndpoint(
                None,
                apart,
                self.security,
                "console_port (TIDELOG_CONSOLE_PORT, or the config file)",
            )
        self.port = 0
        self.metrics_port = 0
        self.console_port = 0
        self._grpc: Any = None
        """grpc.aio's server, or the native one (``_grpc_server``)."""
        self.sites: SiteHost | None = None
        """Where this server's site runs, when ``site_id`` is set (multi-site replication):
        here, or on one broker of the cluster (``site_host.py``)."""
        self.cluster: ClusterNode | None = None
        """This broker's part in a cluster, when ``cluster`` is set."""
        self._health_servicer = health.HealthServicer()
        self.kafka: KafkaListener | None = None
        """The Kafka protocol listener, when ``kafka_port`` is set (``tidelog.kafka``)."""
        self.kafka_port = 0
        self._control: Control | None = None

    async def start(self) -> None:
        """Bind the ports, start the broker, serve. On failure nothing is left running: the
        gRPC server is stopped, the broker closed (its data directory unlocked), the metrics
        endpoint shut."""
        settings = self.settings
        # The HTTP port first: a port in use stops the start before anything else is bound or
        # opened. It serves once the gRPC port is known (the console is a client of it).
        if settings.metrics_port:
            self.metrics_port = self.http.bind(settings.host, settings.metrics_port)
        if self.console_http is not None:
            try:
                self.console_port = self.console_http.bind(settings.host, settings.console_port)
            except OSError:
                self.http.close()
                raise
        server, self.port = _grpc_server(settings, self.security)
        if self.port == 0:
            self._close_http()
            raise OSError(
                f"cannot listen on {settings.host}:{settings.port}: the address is in use or "
                f"not available here; choose another --host/--port"
            )
        broker_started = False
        try:
            await self.broker.start()
            broker_started = True
            retention = QueueRetention(
                settings.sites_queue_retention_bytes,
                settings.sites_queue_retention_age_s,
                # A server run with smaller segments (tests, small disks) keeps them.
                min(QUEUE_SEGMENT_BYTES, settings.segment_max_bytes),
            )

            def make_site(streams: StreamSource | None = None) -> LocalSite:
                return LocalSite(
                    self.broker,
                    settings.site_id,
                    settings.data_dir,
                    retention,
                    ack_timeout_s=settings.sites_ack_timeout_s,
                    streams=streams,
                    tls=self.security.peer_tls(),
                    max_declared=settings.sites_max_declared,
                    window_records=settings.sites_position_window_records,
                )

            if settings.site_id and not settings.cluster:
                self.sites = SiteHost(make_site(), settings.sites)
                await self.sites.start()
                self.metrics.add_sites(self.sites)
            if settings.cluster:
                host = settings.advertised_host or settings.host
                self.cluster = ClusterNode(
                    self.broker,
                    ClusterSettings(
                        etcd=settings.cluster,
                        broker_id=self.broker.broker_id,
                        advertise=settings.advertise or f"{host}:{self.port}",
                        kafka_advertise=self._kafka_advertise(),
                        cluster=settings.cluster_name,
                        lease_ttl_s=settings.cluster_lease_ttl_s,
                        replica_lag_max_s=settings.replica_lag_max_s,
                        ack_timeout_s=settings.cluster_ack_timeout_s,
                        peer_tls=self.security.peer_tls(),
                        etcd_tls=ClientTls(
                            ca=settings.etcd_ca,
                            cert=settings.etcd_cert,
                            key=settings.etcd_key,
                            enabled=settings.cluster.startswith("https://"),
                        ),
                    ),
                )
                if settings.site_id:
                    self.sites = ClusterSite(
                        settings.site_id,
                        self.cluster,
                        make_site,
                        settings.sites,
                        retention.stream_config(),
                        secured=self.security.tls is not None,
                    )
                    self.metrics.add_sites(self.sites)
            self._add_services(server)
            await server.start()
            if self.cluster is not None:
                await self.cluster.start()  # after the server: leaders answer fetches at once
                if self.sites is not None:
                    await self.sites.start()
            address = f"{_connectable(settings.host)}:{self.port}"
            if self.metrics_port:
                await asyncio.to_thread(self.http.start, address)
            if self.console_http is not None:
                await asyncio.to_thread(self.console_http.start, address)
            if settings.kafka_port:
                await self._start_kafka()
        except BaseException:
            # grpc keeps a bound port listening until the server has run: start it (still
            # without the broker's services if they were never added) and stop it at once.
            with contextlib.suppress(Exception):
                await server.start()
            await server.stop(None)
            if self.sites is not None:
                with contextlib.suppress(Exception):
                    await self.sites.close()
            if self.kafka is not None:
                with contextlib.suppress(Exception):
                    await self.kafka.stop()
            if self.cluster is not None:
                with contextlib.suppress(Exception):
                    await self.cluster.close()
            if broker_started:
                await self.broker.close()
            self._close_http()
            raise
        self._grpc = server
        for warning in self.security.exposure_warnings(settings.host):
            LOG.warning("%s", warning)
        if self.sites is not None and self.security.tls is None:
            LOG.warning(
                "site %s replicates without TLS: any caller that reaches this port can send "
                "entries and snapshots as any site (set tls_cert, tls_key and tls_client_ca; "
                'docs/security.md, "Sites trust sites")',
                settings.site_id,
            )
        LOG.info(
            "tidelog listening on %s:%d%s (data in %s, metrics on %s)",
            settings.host,
            self.port,
            " with TLS" if self.security.tls is not None else "",
            settings.data_dir,
            f"{settings.host}:{self.metrics_port}/metrics" if self.metrics_port else "off",
        )
        scheme = "https" if self.security.tls is not None else "http"
        if self.metrics_port and self.http.console is not None:
            LOG.info("web console on %s://%s:%d/", scheme, settings.host, self.metrics_port)
        if self.console_port:
            LOG.info("web console on %s://%s:%d/", scheme, settings.host, self.console_port)

    def _kafka_advertised(self) -> tuple[str, int]:
        """(host, port) Kafka clients are told to reach this broker at: known before the
        listener binds (its port is never 0 when it runs), so a cluster member registers it
        with its membership and every broker's Kafka Metadata names it."""
        settings = self.settings
        host = (
            settings.kafka_advertised_host
            or settings.advertised_host
            or _connectable(settings.host).strip("[]")
        )
        return host, settings.kafka_advertised_port or settings.kafka_port

    def _kafka_advertise(self) -> str:
        """``HOST:PORT`` of :meth:`_kafka_advertised` for the cluster ("" without a listener)."""
        if not self.settings.kafka_port:
            return ""
        host, port = self._kafka_advertised()
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def _start_kafka(self) -> None:
        settings = self.settings
        assert self._control is not None
        tls = self.security.tls
        advertised_host, advertised_port = self._kafka_advertised()
        self.kafka = KafkaListener(
            self._control,
            KafkaConfig(
                host=settings.host,
                port=settings.kafka_port,
                advertised_host=advertised_host,
                advertised_port=advertised_port,
                message_max_bytes=settings.kafka_message_max_bytes,
                request_max_bytes=settings.kafka_request_max_bytes,
                fetch_max_bytes=settings.kafka_fetch_max_bytes,
                auto_create_topics=settings.kafka_auto_create_topics,
                default_partitions=settings.kafka_default_partitions,
                cluster_id=settings.cluster_name if settings.cluster else "tidelog",
                sasl_mechanisms=tuple(settings.kafka_sasl_mechanisms),
            ),
            self.security.door,
            tls=tls.ssl_context() if tls is not None else None,
        )
        self.kafka_port = await self.kafka.start()
        # A reload that revokes a token ends the Kafka connections that logged in with it.
        self.security.rechecks.append(self.kafka.recheck)
        mechanisms = settings.kafka_sasl_mechanisms
        LOG.info(
            "kafka protocol on %s:%d%s%s",
            settings.host,
            self.kafka_port,
            " with TLS" if tls is not None else "",
            f", SASL {', '.join(mechanisms)}" if mechanisms else "",
        )
        tokens = self.security.door.authenticator.tokens
        if SCRAM_MECHANISM in mechanisms and (tokens is None or not tokens.scram):
            LOG.warning(
                "kafka: SCRAM-SHA-256 is offered but %s holds no SCRAM keys: no client can log "
                "in with it until tokens are made with `tidelog token create PRINCIPAL --file "
                "%s --scram` (and SIGHUP)",
                settings.tokens_file,
                settings.tokens_file,
            )

    def _close_http(self) -> None:
        self.http.close()
        if self.console_http is not None:
            self.console_http.close()

    def _add_services(self, server: Any) -> None:
        settings = self.settings
        advertised = Advertised(
            broker_id=self.broker.broker_id,
            host=settings.advertised_host or settings.host,
            port=settings.advertised_port or self.port,
        )
        # The mode is decided here, once: the fronts see only the control.
        control: Control = (
            SingleBroker(self.broker, advertised, self.sites)
            if self.cluster is None
            else ClusterControl(self.broker, self.cluster, self.sites)
        )
        self._control = control
        # Every method registered through the guard (guard.py): access, then the error table.
        registry: Any = GuardedRegistry(server, door=self.security.door)
        inflight = InFlight(
            settings.max_inflight_bytes_per_connection, settings.max_inflight_bytes_per_principal
        )  # one budget for both publishing services
        api_pb2_grpc.add_APIServicer_to_server(
            LiftbridgeService(control, self.metrics, inflight), registry
        )
        cluster_pb2_grpc.add_ReplicationServicer_to_server(ReplicationService(control), registry)
        cluster_pb2_grpc.add_ClusterAdminServicer_to_server(ClusterAdminService(control), registry)
        tidelog_pb2_grpc.add_TidelogServicer_to_server(
            TidelogService(control, self.metrics, inflight), registry
        )
        for service in ("", "proto.API", "tidelog.v1.Tidelog"):
            self._health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self._health_servicer, registry)

    def reload(self) -> list[str]:
        """SIGHUP: certificates, tokens and the ACL read again (``credentials.py``)."""
        return self.security.reload()

    async def stop(self) -> None:
        if self._grpc is None:
            return
        LOG.info("shutting down: ending subscriptions, finishing in-flight calls")
        # The HTTP port first, off this loop: the console's open pages (a live tail) are gRPC
        # calls this loop serves, so waiting for them here would wait for ourselves.
        await asyncio.to_thread(self._close_http)
        self._health_servicer.enter_graceful_shutdown()
        if self.sites is not None and self.cluster is not None:
            await self.sites.close()  # a cluster's site stops before this broker leaves
        if self.cluster is not None:
            # Leave first: the lease is revoked, so other brokers lead at once, while this one
            # ends its subscriptions (their clients then find the new leaders).
            await self.cluster.close()
        if self.kafka is not None:
            await self.kafka.stop()
        self.broker.drain()
        if self.sites is not None and self.cluster is None:
            await self.sites.close()
        await self._grpc.stop(self.settings.shutdown_grace_s)
        await self.broker.close()
        self._grpc = None
        LOG.info("stopped; every log synced and closed")


def _grpc_server(settings: ServerSettings, security: ServerSecurity) -> tuple[Any, int]:
    """The gRPC server ``grpc_transport`` names, bound (port 0 when it cannot bind): the one
    place that chooses. ``native`` is tidelog's own HTTP/2 server (``tidelog.api.transport``),
    which takes the same registrations, the same TLS material (an ``ssl`` context offering
    ALPN h2, client certificates required as grpcio's credentials require them) and the same
    message size limit."""
    address = f"{settings.host}:{settings.port}"
    tls = security.tls
    server: Any
    try:
        if settings.grpc_transport == "native":
            server = NativeServer(
                max_message_length=MAX_FRAME, max_connections=settings.grpc_max_connections
            )
            port = (
                server.add_secure_port(address, tls.ssl_context(alpn=("h2",)))
                if tls is not None
                else server.add_insecure_port(address)
            )
            return server, port
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_FRAME),
                ("grpc.max_send_message_length", MAX_FRAME),
                ("grpc.so_reuseport", 0),
            ]
        )
        port = (
            server.add_secure_port(address, tls.grpc_credentials())
            if tls is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError:
        port = 0
    return server, port


def _connectable(host: str) -> str:
    """An address a client on this machine reaches a server bound to ``host`` at."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def serve(
    settings: ServerSettings,
    *,
    on_ready: Callable[[Server], None] | None = None,
    console: ConsoleFactory | None = None,
) -> None:
    """Run until SIGTERM or SIGINT. The process's files are private to its user (umask 077):
    tidelog creates its own 0600/0700 (``tidelog.durable``), and this covers RocksDB's too."""
    os.umask(0o077)
    server = Server(settings, console=console)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, server.reload)
    if on_ready is not None:
        on_ready(server)
    try:
        await stop.wait()
    finally:
        await server.stop()
