"""Server settings: embedded defaults, then a TOML file, then ``TIDELOG_*`` variables, then flags.

Every setting has a default that works out of the box (``tidelog serve`` with nothing else
listens on 127.0.0.1:9292 with its data in ``./tidelog-data``). ``docs/operations.md`` lists them.

``ServerSettings`` is the one object users configure, and its defaults are the only ones that
apply: it hands every value down (``broker_config()``). A default that a lower layer needs too is
written once, as a constant of that layer (``tidelog.log.config``, ``tidelog.broker.config``,
``tidelog.wire`` for what the client shares), and named here through the broker's face; only the
settings no lower layer knows (the metrics port, shutdown grace, logging) are written here alone.

Settings that cannot be used raise ``InvalidSettings``, whose message is one line naming each wrong
setting as it was given: ``TIDELOG_<NAME>`` when a variable gave it, else its name (a flag's and a
file key's), with what is wrong and what is expected.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tidelog.api.inflight import (
    DEFAULT_INFLIGHT_BYTES_PER_CONNECTION,
    DEFAULT_INFLIGHT_BYTES_PER_PRINCIPAL,
)
from tidelog.broker import (
    DEFAULT_CURSOR_PARTITIONS,
    DEFAULT_DATA_DIR,
    DEFAULT_FLUSH_INTERVAL_S,
    DEFAULT_FLUSH_POLICY,
    DEFAULT_MAINTENANCE_INTERVAL_S,
    DEFAULT_MAX_CURSORS_PER_STREAM,
    DEFAULT_MAX_GROUPS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_PARTITIONS_PER_STREAM,
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_VIEWS,
    DEFAULT_OPEN_FILES_MAX,
    DEFAULT_RETENTION_AGE_S,
    DEFAULT_SEGMENT_MAX_AGE_S,
    DEFAULT_SEGMENT_MAX_BYTES,
    DEFAULT_SUBSCRIBER_BUFFER_BYTES,
    MAX_MESSAGE_BYTES_LIMIT,
    MAX_PARTITIONS,
    MIN_SEGMENT_BYTES,
    BrokerConfig,
    FlushPolicy,
    LogConfig,
)
from tidelog.cluster import DEFAULT_ACK_TIMEOUT_S, DEFAULT_LEASE_TTL_S, DEFAULT_REPLICA_LAG_MAX_S
from tidelog.kafka import (
    DEFAULT_FETCH_MAX_BYTES,
    DEFAULT_KAFKA_MESSAGE_MAX_BYTES,
    DEFAULT_REQUEST_MAX_BYTES,
    KAFKA_SASL_MECHANISMS,
)
from tidelog.wire import DEFAULT_HOST, DEFAULT_PORT

ENV_PREFIX = "TIDELOG_"


class InvalidSettings(ValueError):
    """Settings that cannot be used; ``str()`` is one line (problems separated by ``; ``)."""


class ServerSettings(BaseSettings):
    """Everything ``tidelog serve`` can be told."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    data_dir: Path = Field(Path(DEFAULT_DATA_DIR), description="where streams are stored")
    host: str = Field(DEFAULT_HOST, description="address the gRPC server binds")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="gRPC port (0: pick a free one)")
    advertised_host: str = Field("", description="host reported in metadata (default: host)")
    advertised_port: int = Field(0, ge=0, le=65535, description="port in metadata (default: port)")
    broker_id: str = Field("", description="broker id in metadata (default: kept in data_dir)")
    site_id: str = Field(
        "",
        pattern=r"^([A-Za-z0-9][A-Za-z0-9_-]{0,62})?$",
        description="this deployment's site id for multi-site replication (empty: sites off)",
    )
    sites: dict[str, str] = Field(
        default_factory=dict,
        description="remote sites to declare at start, site id -> HOST:PORT (needs site_id)",
    )
    sites_queue_retention_bytes: int | None = Field(
        None,
        ge=0,
        description="retention backstop of the sites' delta queue __lrq_delta in bytes: beyond it "
        "the oldest entries go even if a site has not acknowledged them (that site then needs a "
        "snapshot sync); none: retention_bytes",
    )
    sites_queue_retention_age_s: float | None = Field(
        None,
        gt=0,
        description="retention backstop of __lrq_delta by age (seconds); none: retention_age_s",
    )
    sites_ack_timeout_s: float = Field(
        10.0,
        gt=0,
        description="how long a remote site has to acknowledge a batch before it is sent again "
        "(then after twice as long, twice); with no ack after that, the site gets a snapshot sync. "
        "Raise it for slow links",
    )
    sites_max_declared: int = Field(
        16,
        ge=1,
        le=64,
        description="how many remote sites AddSite declares at most (RESOURCE_EXHAUSTED beyond; "
        "sites in the settings count but are always declared); 64 is the format's limit",
    )
    sites_position_window_records: int = Field(
        1 << 22,
        ge=1,
        description="how many of a source's records a delta batch may reach past what this sink "
        "applied from it; a batch beyond is refused (a forged position far ahead), and a real "
        "source answers with a snapshot sync",
    )
    cluster: str = Field(
        "",
        description="etcd endpoint (http://HOST:PORT, or https://HOST:PORT for TLS) of the "
        "cluster this broker joins; empty: a single broker with no etcd (the default)",
    )
    cluster_name: str = Field(
        "default", pattern=r"^[A-Za-z0-9_.-]+$", description="the cluster's name (its etcd prefix)"
    )
    etcd_ca: Path | None = Field(
        None,
        description="PEM CA that signed etcd's certificate, with an https:// cluster URL "
        "(default: the system's roots)",
    )
    etcd_cert: Path | None = Field(
        None,
        description="PEM client certificate this broker presents to etcd (with etcd_key; etcd's "
        "--client-cert-auth); with etcd's authentication on, its common name is the etcd user",
    )
    etcd_key: Path | None = Field(None, description="PEM private key of etcd_cert")
    advertise: str = Field(
        "",
        description="HOST:PORT other brokers and clients reach this broker at, in a cluster "
        "(default: advertised_host or host, and the bound port)",
    )
    cluster_lease_ttl_s: int = Field(
        DEFAULT_LEASE_TTL_S,
        ge=2,
        le=60,
        description="a broker that stops refreshing its etcd lease for this long leaves the "
        "cluster (its partitions get new leaders)",
    )
    cluster_ack_timeout_s: float = Field(
        DEFAULT_ACK_TIMEOUT_S,
        gt=0,
        description="how long a publish with ack policy ALL waits for the in-sync replicas "
        "before it fails with UNAVAILABLE (retryable); above replica_lag_max_s, so a publish "
        "that waits for a follower that stopped is acknowledged once the ISR drops it",
    )
    replica_lag_max_s: float = Field(
        DEFAULT_REPLICA_LAG_MAX_S,
        gt=0,
        description="a follower that has not caught up with its leader for this long leaves "
        "the ISR (it rejoins once caught up)",
    )
    tls_cert: Path | None = Field(
        None,
        description="PEM certificate chain of this server: TLS on the gRPC port and the HTTP "
        "port (with tls_key); reloaded on SIGHUP",
    )
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert")
    tls_client_ca: Path | None = Field(
        None,
        description="PEM CA that signs client certificates: with it every client must present "
        "one (mutual TLS), and its subject alternative name (else common name) is the principal",
    )
    tls_ca: Path | None = Field(
        None,
        description="PEM CA this server checks other brokers' and sites' certificates against "
        "when it calls them (default: tls_client_ca)",
    )
    tokens_file: Path | None = Field(
        None,
        description="TOML file of bearer-token hashes per principal (`tidelog token create` "
        "writes it); needs TLS; reloaded on SIGHUP",
    )
    acl_file: Path | None = Field(
        None,
        description="TOML access-control list (docs/security.md): with it, every call is "
        "checked and anything not allowed is denied; reloaded on SIGHUP",
    )
    principal_rules: list[str] = Field(
        default_factory=list,
        description="rules 'PATTERN => REPLACEMENT' mapping a certificate's name to a principal; "
        "the first whose pattern matches the whole name applies",
    )
    allow_anonymous: bool = Field(
        False,
        description="with tokens_file or acl_file: admit callers without credentials as the "
        "principal 'anonymous' (the ACL decides what it may do) instead of UNAUTHENTICATED",
    )
    metrics_port: int = Field(
        9293,
        ge=0,
        le=65535,
        description="HTTP port on host: Prometheus /metrics, and the web console at / "
        "(0: disabled)",
    )
    console: bool = Field(
        True, description="serve the web console at / on the metrics port (false: /metrics only)"
    )
    console_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="the web console's own HTTP port on host (0: at / on the metrics port; N: on "
        "port N, the metrics port then serving /metrics alone)",
    )
    console_hosts: list[str] = Field(
        default_factory=list,
        description="the names the console is served under ('name' on the console's port, or "
        "'name:port'); a request for any other Host is refused (DNS rebinding). Default: "
        "localhost, 127.0.0.1, [::1] and host",
    )
    kafka_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="port of the Kafka protocol listener on host (0: off; docs/kafka.md)",
    )
    kafka_advertised_host: str = Field(
        "", description="host Kafka clients are told in Metadata (default: advertised_host or host)"
    )
    kafka_advertised_port: int = Field(
        0, ge=0, le=65535, description="port Kafka clients are told (default: the Kafka port)"
    )
    kafka_message_max_bytes: int = Field(
        DEFAULT_KAFKA_MESSAGE_MAX_BYTES,
        ge=1024,
        description="largest record batch a Kafka produce may carry (Kafka's message.max.bytes)",
    )
    kafka_request_max_bytes: int = Field(
        DEFAULT_REQUEST_MAX_BYTES,
        ge=1 << 16,
        description="largest Kafka request frame; a larger one closes the connection "
        "(Kafka's socket.request.max.bytes)",
    )
    kafka_fetch_max_bytes: int = Field(
        DEFAULT_FETCH_MAX_BYTES,
        ge=1 << 16,
        le=1 << 30,
        description="most record bytes one Kafka Fetch answer carries, whatever the client asks "
        "(Kafka's fetch.max.bytes)",
    )
    kafka_auto_create_topics: bool = Field(
        True,
        description="create a topic a Kafka producer names (Kafka's auto.create.topics.enable); "
        "the caller needs the create grant",
    )
    kafka_default_partitions: int = Field(
        1, ge=1, description="partitions of a topic the Kafka front creates by itself"
    )
    kafka_sasl_mechanisms: list[str] = Field(
        default_factory=list,
        description="SASL mechanisms the Kafka listener offers: PLAIN, SCRAM-SHA-256 (the "
        "password is a token of tokens_file; needs TLS; docs/security.md, 'Kafka clients')",
    )
    flush_policy: FlushPolicy = Field(DEFAULT_FLUSH_POLICY, description="always|interval|never")
    flush_interval_s: float = Field(DEFAULT_FLUSH_INTERVAL_S, gt=0)
    segment_max_bytes: int = Field(DEFAULT_SEGMENT_MAX_BYTES, ge=MIN_SEGMENT_BYTES)
    segment_max_age_s: float = Field(DEFAULT_SEGMENT_MAX_AGE_S, gt=0)
    retention_bytes: int | None = Field(None, ge=0)
    retention_messages: int | None = Field(None, ge=0)
    retention_age_s: float | None = Field(DEFAULT_RETENTION_AGE_S, gt=0)
    max_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=1, le=MAX_MESSAGE_BYTES_LIMIT)
    maintenance_interval_s: float = Field(DEFAULT_MAINTENANCE_INTERVAL_S, gt=0)
    subscriber_buffer_bytes: int = Field(
        DEFAULT_SUBSCRIBER_BUFFER_BYTES,
        ge=4096,
        description="per-subscription byte budget: record bytes one subscription holds in hand",
    )
    open_files_max: int = Field(
        DEFAULT_OPEN_FILES_MAX,
        ge=16,
        description="descriptors the open segment files may hold together (least recently used "
        "closed beyond it); keep it well under `ulimit -n`",
    )
    max_inflight_bytes_per_connection: int = Field(
        DEFAULT_INFLIGHT_BYTES_PER_CONNECTION,
        ge=1 << 20,
        description="publish request bytes one connection may have in flight: a unary publish "
        "beyond it is refused RESOURCE_EXHAUSTED, a publish stream waits (docs/operations.md)",
    )
    max_inflight_bytes_per_principal: int = Field(
        DEFAULT_INFLIGHT_BYTES_PER_PRINCIPAL,
        ge=1 << 20,
        description="publish request bytes one principal may have in flight over all its "
        "connections (callers without credentials share one budget)",
    )
    max_streams: int = Field(
        DEFAULT_MAX_STREAMS, ge=1, description="client streams this broker holds"
    )
    max_partitions_per_stream: int = Field(
        DEFAULT_MAX_PARTITIONS_PER_STREAM,
        ge=1,
        le=MAX_PARTITIONS,
        description="partitions a stream may be created with",
    )
    max_groups: int = Field(
        DEFAULT_MAX_GROUPS, ge=1, description="consumer groups this broker coordinates"
    )
    max_views: int = Field(
        DEFAULT_MAX_VIEWS, ge=0, description="materialised views of all streams together"
    )
    max_cursors_per_stream: int = Field(
        DEFAULT_MAX_CURSORS_PER_STREAM, ge=1, description="cursor ids one stream may have"
    )
    cursor_partitions: int = Field(
        DEFAULT_CURSOR_PARTITIONS,
        ge=1,
        le=64,
        description="partitions of __cursors when it is first created",
    )
    group_consumer_timeout_s: float = Field(
        15.0,
        gt=0,
        description="a consumer-group member whose heartbeats stop this long is removed "
        "(Liftbridge's groups.consumer.timeout)",
    )
    group_coordinator_timeout_s: float = Field(
        15.0,
        gt=0,
        description="reports of an unreachable group coordinator count this long (Liftbridge's "
        "groups.coordinator.timeout)",
    )
    shutdown_grace_s: float = Field(5.0, ge=0, description="time in-flight calls get on SIGTERM")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    grpc_transport: Literal["grpcio", "native"] = Field(
        "native",
        description="what serves the gRPC port: tidelog's own HTTP/2 server (native: many stream "
        "messages per write, far less CPU per Subscribe message), or grpcio's server "
        "(docs/architecture.md)",
    )
    grpc_max_connections: int = Field(
        4096,
        ge=1,
        description="client connections the native gRPC transport serves at once; one more is "
        "closed as soon as it is accepted (grpc_transport = native only)",
    )

    @model_validator(mode="after")
    def _sites_need_a_site_id(self) -> ServerSettings:
        if self.sites and not self.site_id:
            raise ValueError(
                "sites are declared but site_id is not set: give this server a site id "
                "(--site-id, or site_id) to replicate to them"
            )
        return self

    @model_validator(mode="after")
    def _a_cluster_needs_a_broker_id(self) -> ServerSettings:
        if self.cluster and not self.broker_id:
            raise ValueError(
                "a cluster member needs its own broker id: give --broker-id (or broker_id)"
            )
        if self.advertise and ":" not in self.advertise:
            raise ValueError(f"advertise is HOST:PORT, got {self.advertise!r}")
        return self

    @model_validator(mode="after")
    def _etcd_tls_needs_https(self) -> ServerSettings:
        if (self.etcd_cert is None) != (self.etcd_key is None):
            raise ValueError("etcd_cert and etcd_key go together: give both, or neither")
        given = self.etcd_ca or self.etcd_cert
        if given and not self.cluster.startswith("https://"):
            raise ValueError(
                "etcd_ca and etcd_cert are for an etcd reached over TLS: write the cluster URL "
                "https://HOST:PORT"
            )
        return self

    @model_validator(mode="after")
    def _tls_comes_whole(self) -> ServerSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both, or neither")
        if self.tls_cert is None and (self.tls_client_ca or self.tokens_file):
            raise ValueError(
                "tls_client_ca and tokens_file need TLS: give tls_cert and tls_key too (a token "
                "sent without TLS crosses the network readable)"
            )
        unknown = set(self.kafka_sasl_mechanisms) - set(KAFKA_SASL_MECHANISMS)
        if unknown:
            raise ValueError(
                f"kafka_sasl_mechanisms: {', '.join(sorted(unknown))} not served (one of "
                f"{', '.join(KAFKA_SASL_MECHANISMS)})"
            )
        if self.kafka_sasl_mechanisms and self.tokens_file is None:
            raise ValueError(
                "kafka_sasl_mechanisms needs tokens_file (and so TLS): a SASL password is a "
                "tidelog token (`tidelog token create PRINCIPAL --file F [--scram]`); SASL on a "
                "plaintext listener is not served, as the password would cross the network "
                "readable"
            )
        for rule in self.principal_rules:
            if " => " not in rule:
                raise ValueError(f"principal_rules: {rule!r} is not 'PATTERN => REPLACEMENT'")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def authentication_required(self) -> bool:
        return (self.acl_file is not None or self.tokens_file is not None) and not (
            self.allow_anonymous
        )

    def broker_config(self) -> BrokerConfig:
        return BrokerConfig(
            data_dir=str(self.data_dir),
            broker_id=self.broker_id,
            log=LogConfig(
                segment_max_bytes=self.segment_max_bytes,
                segment_max_age_s=self.segment_max_age_s,
                max_message_bytes=self.max_message_bytes,
                retention_bytes=self.retention_bytes,
                retention_messages=self.retention_messages,
                retention_age_s=self.retention_age_s,
                flush_policy=self.flush_policy,
                flush_interval_s=self.flush_interval_s,
            ),
            maintenance_interval_s=self.maintenance_interval_s,
            cursor_partitions=self.cursor_partitions,
            subscriber_buffer_bytes=self.subscriber_buffer_bytes,
            open_files_max=self.open_files_max,
            max_streams=self.max_streams,
            max_partitions_per_stream=self.max_partitions_per_stream,
            max_groups=self.max_groups,
            max_views=self.max_views,
            max_cursors_per_stream=self.max_cursors_per_stream,
            group_consumer_timeout_s=self.group_consumer_timeout_s,
            group_coordinator_timeout_s=self.group_coordinator_timeout_s,
            clustered=bool(self.cluster),
        )


def load_settings(config_file: Path | None = None, **flags: Any) -> ServerSettings:
    """Settings from (lowest to highest precedence) defaults, ``config_file``, environment
    variables and ``flags`` (None values in ``flags`` are ignored).

    Raises ``FileNotFoundError`` for a missing ``config_file`` and ``InvalidSettings`` for a file
    that is not TOML or a value that is not valid."""
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        return _load(config_file, given)
    except ValidationError as error:
        raise InvalidSettings(_problems(error, given, os.environ)) from None
    except tomllib.TOMLDecodeError as error:
        raise InvalidSettings(f"{config_file}: not a TOML file: {error}") from None


def _problems(error: ValidationError, flags: Collection[str], environ: Collection[str]) -> str:
    """Each of ``error``'s problems as ``SETTING: what is wrong (got VALUE)``, on one line."""
    variables = {name.upper() for name in environ}  # pydantic-settings matches them in any case
    problems = []
    for found in error.errors(include_url=False):
        loc = [str(part) for part in found["loc"]]
        message = found["msg"].removeprefix("Value error, ")
        if not loc:  # a rule across settings (a model validator): its message names them
            problems.append(message)
            continue
        variable = ENV_PREFIX + loc[0].upper()
        if loc[0] not in flags and variable in variables:
            loc[0] = variable
        if found["type"] == "extra_forbidden":
            problem = "not a setting (docs/operations.md lists them)"
        else:
            problem = f"{message[:1].lower()}{message[1:]} (got {found['input']!r})"
        problems.append(f"{'.'.join(loc)}: {problem}")
    return "; ".join(problems)


def _load(config_file: Path | None, given: dict[str, Any]) -> ServerSettings:
    if config_file is None:
        return ServerSettings(**given)
    if not config_file.is_file():
        raise FileNotFoundError(f"configuration file not found: {config_file}")

    class FromFile(ServerSettings):
        model_config = SettingsConfigDict(
            env_prefix=ENV_PREFIX, extra="forbid", toml_file=config_file
        )

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)

    return ServerSettings.model_validate(FromFile(**given).model_dump())
