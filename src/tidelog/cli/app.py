"""``tidelog``: serve, console, streams, publish, tail, cursors.

People get rich tables and progress bars; scripts get ``--json`` (one object per line for
``tail``). Every client command takes ``--server host:port`` (env ``TIDELOG_SERVER``) and the
connection options ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--tls`` and ``--token``
(``cli/common.py``; env ``TIDELOG_TLS_CA``, ...). Errors
from the server are printed as one line, with exit code 1; bad usage exits 2.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tidelog import __version__
from tidelog.cli.cluster_commands import cluster_app
from tidelog.cli.common import PLAINTEXT, ServerOption, client_command, err, fail, guarded, out
from tidelog.cli.site_commands import site_app
from tidelog.cli.tail_command import tail
from tidelog.cli.token_commands import token_app
from tidelog.cli.view_commands import parse_view, query_app, view_app
from tidelog.client import (
    DEFAULT_SERVER,
    Client,
    ClientSettings,
    ClientTls,
    Message,
)
from tidelog.client.aio import PUBLISH_CHUNK
from tidelog.errors import GroupStateUnreadable, InvalidArgument, LogLocked, MetadataUnavailable

app = typer.Typer(
    help="tidelog: a durable, partitioned streaming log.",
    no_args_is_help=True,
    add_completion=False,
    # A traceback with locals would print --token's value (typer's default; said here so it
    # stays so).
    pretty_exceptions_show_locals=False,
)
stream_app = typer.Typer(help="Create, list, inspect and delete streams.", no_args_is_help=True)
cursor_app = typer.Typer(help="Read and write consumer cursors.", no_args_is_help=True)
app.add_typer(stream_app, name="stream")
app.add_typer(cursor_app, name="cursor")


def version_callback(value: bool) -> None:
    if value:
        out.print(f"tidelog {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """tidelog: a durable, partitioned streaming log."""


# -- serve -----------------------------------------------------------------------------------------


@app.command()
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="data directory [./tidelog-data]")] = None,
    host: Annotated[str | None, typer.Option(help="bind address [127.0.0.1]")] = None,
    port: Annotated[
        str | None, typer.Option(metavar="<int>", help="gRPC port [9292]; 0 picks a free one")
    ] = None,
    advertised_host: Annotated[str | None, typer.Option(help="host reported in metadata")] = None,
    advertised_port: Annotated[
        str | None, typer.Option(metavar="<int>", help="port reported in metadata")
    ] = None,
    metrics_port: Annotated[
        str | None, typer.Option(metavar="<int>", help="/metrics port [9293]; 0: off")
    ] = None,
    kafka_port: Annotated[
        str | None,
        typer.Option(metavar="<int>", help="Kafka protocol port [0]; 0: off (docs/kafka.md)"),
    ] = None,
    kafka_advertised_host: Annotated[
        str | None, typer.Option(help="host Kafka clients are told in Metadata")
    ] = None,
    kafka_message_max_bytes: Annotated[
        str | None,
        typer.Option(metavar="<int>", help="largest Kafka record batch [1048576]"),
    ] = None,
    kafka_request_max_bytes: Annotated[
        str | None,
        typer.Option(metavar="<int>", help="largest Kafka request frame [104857600]"),
    ] = None,
    kafka_advertised_port: Annotated[
        str | None, typer.Option(metavar="<int>", help="port Kafka clients are told in Metadata")
    ] = None,
    site_id: Annotated[
        str | None,
        typer.Option(help="this site's id for multi-site replication (default: none, sites off)"),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster", help="join a cluster whose metadata is in etcd at http://HOST:PORT"
        ),
    ] = None,
    broker_id: Annotated[
        str | None, typer.Option(help="this broker's id (a cluster needs one per broker)")
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(help="HOST:PORT other brokers and clients reach this broker at (cluster)"),
    ] = None,
    flush_policy: Annotated[
        str | None, typer.Option(help="always, interval or never [interval]")
    ] = None,
    log_format: Annotated[str | None, typer.Option(help="text or json [text]")] = None,
    grpc_transport: Annotated[
        str | None,
        typer.Option(help="what serves the gRPC port: native or grpcio [native]"),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="DEBUG, INFO, WARNING, ERROR [INFO]")
    ] = None,
    tls_cert: Annotated[
        str | None,
        typer.Option(
            metavar="<path>",
            help="PEM certificate chain: TLS on the gRPC and HTTP ports (with --tls-key)",
            rich_help_panel="Security",
        ),
    ] = None,
    tls_key: Annotated[
        str | None,
        typer.Option(
            metavar="<path>", help="PEM private key of --tls-cert", rich_help_panel="Security"
        ),
    ] = None,
    tls_client_ca: Annotated[
        str | None,
        typer.Option(
            metavar="<path>",
            help="PEM CA of client certificates: every client must present one (mutual TLS)",
            rich_help_panel="Security",
        ),
    ] = None,
    tls_ca: Annotated[
        str | None,
        typer.Option(
            metavar="<path>",
            help="PEM CA of other brokers' and sites' certificates (default: --tls-client-ca)",
            rich_help_panel="Security",
        ),
    ] = None,
    tokens_file: Annotated[
        str | None,
        typer.Option(
            metavar="<path>",
            help="bearer-token hashes (`tidelog token create`); needs TLS",
            rich_help_panel="Security",
        ),
    ] = None,
    acl_file: Annotated[
        str | None,
        typer.Option(
            metavar="<path>",
            help="access-control list (docs/security.md): what is not allowed is denied",
            rich_help_panel="Security",
        ),
    ] = None,
    allow_anonymous: Annotated[
        bool | None,
        typer.Option(
            "--allow-anonymous/--no-allow-anonymous",
            help="with --acl-file or --tokens-file: admit callers without credentials (the "
            "ACL decides what they may do) rather than refuse them; default: refuse",
            show_default=False,
            rich_help_panel="Security",
        ),
    ] = None,
) -> None:
    """Run a tidelog server until SIGTERM or Ctrl-C (settings: flags > TIDELOG_* > --config).

    Principal rules (principal_rules) are given in the --config file or TIDELOG_PRINCIPAL_RULES
    (a JSON list): docs/security.md."""
    # The defaults in brackets are ServerSettings' (tests/api/test_settings_defaults.py holds them
    # equal); naming them here would load the server's modules for every client command. The
    # flags are text, checked by ServerSettings alone: a bad value is then one line naming the
    # setting, whichever source gave it (not click's error box for a flag, pydantic's report else).
    from tidelog.api.server import Server, configure_logging
    from tidelog.api.server import serve as run
    from tidelog.api.settings import load_settings

    try:
        settings = load_settings(
            config,
            data_dir=data_dir,
            host=host,
            port=port,
            advertised_host=advertised_host,
            advertised_port=advertised_port,
            metrics_port=metrics_port,
            kafka_port=kafka_port,
            kafka_advertised_host=kafka_advertised_host,
            kafka_advertised_port=kafka_advertised_port,
            kafka_message_max_bytes=kafka_message_max_bytes,
            kafka_request_max_bytes=kafka_request_max_bytes,
            site_id=site_id,
            cluster=cluster,
            broker_id=broker_id,
            advertise=advertise,
            flush_policy=flush_policy,
            log_format=log_format,
            grpc_transport=grpc_transport,
            log_level=log_level.upper() if log_level else None,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
            tls_ca=tls_ca,
            tokens_file=tokens_file,
            acl_file=acl_file,
            allow_anonymous=allow_anonymous,
        )
    except (FileNotFoundError, ValueError) as error:  # InvalidSettings is a ValueError
        fail(str(error), 2)
    configure_logging(settings)

    def ready(server: Server) -> None:
        # A line scripts and tests can wait for (stdout, flushed).
        print(f"tidelog listening on {settings.host}:{server.port}", flush=True)

    console: Any = None
    if settings.console and (settings.metrics_port or settings.console_port):
        from tidelog.console import for_server

        console = for_server

    try:
        asyncio.run(run(settings, on_ready=ready, console=console))
    # MetadataUnavailable: the cluster's etcd refused or cannot be reached (its message says why).
    except (
        OSError,
        LogLocked,
        GroupStateUnreadable,
        InvalidArgument,
        MetadataUnavailable,
    ) as error:
        fail(f"cannot start: {error}")


# -- console ---------------------------------------------------------------------------------------


@app.command("console")
def console_command(
    server: ServerOption = DEFAULT_SERVER,
    host: Annotated[str, typer.Option(help="address the console binds")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the console's HTTP port; 0 picks a free one")] = 9294,
    sample_interval: Annotated[
        float, typer.Option(min=0.1, help="seconds between samples of rates and lag")
    ] = 5.0,
    stall_after: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="a consumer with lag whose cursor has not moved this long "
            "(seconds) is shown as stalled",
        ),
    ] = 60.0,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            help="a name (NAME or NAME:PORT) the console is served under besides localhost, "
            "127.0.0.1, [::1] and --host; other Host headers are refused (repeatable)"
        ),
    ] = None,
) -> None:
    """Serve the web console for a tidelog server (`tidelog serve` serves it too, at / on its
    metrics port) until Ctrl-C. It has no login: it acts with the TLS and token of
    TIDELOG_TLS_CA, TIDELOG_TLS_CERT, TIDELOG_TLS_KEY and TIDELOG_TOKEN for whoever reaches
    its port."""
    from tidelog.console import CONSOLE_CLIENT_SETTINGS, ConsoleConfig
    from tidelog.console import run as run_console

    try:
        client = ClientSettings.from_env(
            retry_budget_s=CONSOLE_CLIENT_SETTINGS.retry_budget_s,
            connect_timeout_s=CONSOLE_CLIENT_SETTINGS.connect_timeout_s,
        )
    except ValueError as error:
        fail(str(error), 2)
    config = ConsoleConfig(
        server, sample_interval_s=sample_interval, stall_after_s=stall_after, client=client
    )
    try:
        run_console(config, host, port, allow_host or ())
    except OSError as error:
        fail(f"cannot start: {error}")


# -- streams ---------------------------------------------------------------------------------------


@stream_app.command("create")
@client_command
def stream_create(
    name: str,
    server: ServerOption = DEFAULT_SERVER,
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1)] = 1,
    retention_bytes: Annotated[
        int | None, typer.Option(help="keep at least this many bytes")
    ] = None,
    retention_messages: Annotated[int | None, typer.Option(help="keep at least N messages")] = None,
    retention_age: Annotated[float | None, typer.Option(help="seconds to keep messages")] = None,
    segment_bytes: Annotated[int | None, typer.Option(help="segment size before rolling")] = None,
    compact: Annotated[bool, typer.Option(help="keep only the latest message per key")] = False,
    replication_factor: Annotated[
        int,
        typer.Option(
            "--replication-factor",
            min=-1,
            help="copies of each partition in a cluster (-1: every broker)",
        ),
    ] = 1,
    min_isr: Annotated[
        int | None,
        typer.Option(
            "--min-isr", min=1, help="in-sync copies needed to acknowledge a publish (cluster)"
        ),
    ] = None,
    view: Annotated[
        list[str] | None,
        typer.Option(
            "--view",
            help="declare a view: NAME (table), NAME:WINDOW_MS or NAME:WINDOW_MS:RETENTION_MS",
        ),
    ] = None,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Create a stream (with --view, also its materialised views)."""
    views = [parse_view(spec) for spec in view or []]
    with guarded(server, credentials) as client:
        client.create_stream(
            name,
            partitions=partitions,
            retention_bytes=retention_bytes,
            retention_messages=retention_messages,
            retention_age_s=retention_age,
            segment_max_bytes=segment_bytes,
            compact=compact,
            views=views,
            replication_factor=replication_factor,
            min_isr=min_isr,
        )
    copies = "" if replication_factor == 1 else f", replication factor {replication_factor}"
    out.print(f"created stream [bold]{name}[/bold] with {partitions} partition(s){copies}")


@stream_app.command("list")
@client_command
def stream_list(
    server: ServerOption = DEFAULT_SERVER,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per stream")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """List streams with their partitions' newest offsets."""
    with guarded(server, credentials) as client:
        streams = client.list_streams()
    if as_json:
        for s in streams:
            print(json.dumps(_stream_json(s)))
        return
    table = Table("stream", "partitions", "messages (newest+1)", "paused", "readonly")
    for s in streams:
        table.add_row(
            s.name,
            str(len(s.partitions)),
            str(sum(p.newest_offset + 1 for p in s.partitions)),
            ",".join(str(p.partition) for p in s.partitions if p.paused) or "-",
            ",".join(str(p.partition) for p in s.partitions if p.readonly) or "-",
        )
    out.print(table)


def _stream_json(info: Any) -> dict[str, Any]:
    return {
        "name": info.name,
        "subject": info.subject,
        "created": info.created,
        "partitions": [
            {
                "partition": p.partition,
                "high_watermark": p.high_watermark,
                "newest_offset": p.newest_offset,
                "paused": p.paused,
                "readonly": p.readonly,
                "leader": p.leader,
            }
            for p in info.partitions
        ],
    }


@stream_app.command("info")
@client_command
def stream_info(
    name: str,
    server: ServerOption = DEFAULT_SERVER,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Show one stream's partitions."""
    with guarded(server, credentials) as client:
        info = client.stream_info(name)
    if as_json:
        print(json.dumps(_stream_json(info)))
        return
    table = Table(
        "partition",
        "high watermark",
        "newest offset",
        "paused",
        "readonly",
        "leader",
        title=f"stream {info.name} (subject {info.subject})",
    )
    for p in info.partitions:
        table.add_row(
            str(p.partition),
            str(p.high_watermark),
            str(p.newest_offset),
            "yes" if p.paused else "no",
            "yes" if p.readonly else "no",
            p.leader,
        )
    out.print(table)


@stream_app.command("delete")
@client_command
def stream_delete(
    name: str, server: ServerOption = DEFAULT_SERVER, credentials: ClientTls = PLAINTEXT
) -> None:
    """Delete a stream and all its messages."""
    with guarded(server, credentials) as client:
        client.delete_stream(name)
    out.print(f"deleted stream [bold]{name}[/bold]")


# -- publish ---------------------------------------------------------------------------------------


def _headers(pairs: list[str]) -> dict[str, bytes]:
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            fail(f"--header takes name=value, got {pair!r}", 2)
        headers[name] = value.encode()
    return headers


@app.command()
@client_command
def publish(
    stream: str,
    value: Annotated[str | None, typer.Argument(help="the message (or use --file)")] = None,
    server: ServerOption = DEFAULT_SERVER,
    key: Annotated[str | None, typer.Option("--key", "-k")] = None,
    partition: Annotated[int | None, typer.Option("--partition", "-p")] = None,
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="name=value")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="one message per line; - = stdin")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print acks as JSON")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Publish one message, or every line of a file (with a progress bar)."""
    headers = _headers(header or [])
    key_bytes = key.encode() if key is not None else None
    if (value is None) == (file is None):
        fail("give either a VALUE or --file", 2)
    with guarded(server, credentials) as client:
        if value is not None:
            ack = client.publish(
                stream, value.encode(), key=key_bytes, headers=headers or None, partition=partition
            )
            if as_json:
                print(
                    json.dumps(
                        {"stream": ack.stream, "partition": ack.partition, "offset": ack.offset}
                    )
                )
            else:
                out.print(f"published to {ack.stream}/{ack.partition} at offset {ack.offset}")
            return
        assert file is not None
        total = _publish_file(client, stream, file, key_bytes, headers, partition)
        if as_json:
            print(json.dumps({"stream": stream, "published": total}))
        else:
            out.print(f"published {total} messages to {stream}")


def _lines(path: Path) -> Iterator[bytes]:
    source = sys.stdin.buffer if str(path) == "-" else open(path, "rb")  # noqa: SIM115
    try:
        for line in source:
            yield line.rstrip(b"\r\n")
    finally:
        if source is not sys.stdin.buffer:
            source.close()


def _publish_file(
    client: Client,
    stream: str,
    path: Path,
    key: bytes | None,
    headers: dict[str, bytes],
    partition: int | None,
) -> int:
    if str(path) != "-" and not path.is_file():
        fail(f"no such file: {path}", 2)
    size = None if str(path) == "-" else path.stat().st_size
    plain = key is None and not headers
    total = 0
    with Progress(
        TextColumn("publishing"),
        BarColumn(),
        TextColumn("{task.completed:,.0f} B"),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("publish", total=size)
        batch: list[bytes | Message] = []
        done_bytes = 0
        for line in _lines(path):
            batch.append(line if plain else Message(line, key=key, headers=headers))
            done_bytes += len(line) + 1
            if len(batch) == PUBLISH_CHUNK:
                client.publish_batch(stream, batch, partition=partition)
                total += len(batch)
                batch = []
                bar.update(task, completed=done_bytes)
        if batch:
            client.publish_batch(stream, batch, partition=partition)
            total += len(batch)
        bar.update(task, completed=done_bytes)
    return total


# -- tail ------------------------------------------------------------------------------------------

app.command()(tail)  # tail_command.py: every partition merged, filtered on the server


# -- cursors ---------------------------------------------------------------------------------------


@cursor_app.command("get")
@client_command
def cursor_get(
    cursor_id: str,
    stream: str,
    server: ServerOption = DEFAULT_SERVER,
    partition: Annotated[int, typer.Option("--partition", "-p")] = 0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Print a cursor's offset (-1 when it was never set)."""
    with guarded(server, credentials) as client:
        offset = client.fetch_cursor(cursor_id, stream, partition)
    if as_json:
        print(
            json.dumps(
                {"cursor": cursor_id, "stream": stream, "partition": partition, "offset": offset}
            )
        )
    else:
        print(offset)


@cursor_app.command("set")
@client_command
def cursor_set(
    cursor_id: str,
    stream: str,
    offset: int,
    server: ServerOption = DEFAULT_SERVER,
    partition: Annotated[int, typer.Option("--partition", "-p")] = 0,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Store a cursor's offset."""
    with guarded(server, credentials) as client:
        client.set_cursor(cursor_id, stream, partition, offset)
    out.print(f"cursor {cursor_id} on {stream}/{partition} = {offset}")


@cursor_app.command("lag")
@client_command
def cursor_lag(
    cursor_id: str,
    stream: str,
    server: ServerOption = DEFAULT_SERVER,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """A cursor's position on every partition of a stream, and how far behind the newest
    record it is. A consumer group's positions are the cursor __group:<group id> (tidelog and
    Kafka groups alike)."""
    with guarded(server, credentials) as client:
        partitions = client.describe_stream(stream).partitions
        rows = []
        for p in partitions:
            position = client.fetch_cursor(cursor_id, stream, p.partition)
            lag = None if position < 0 else max(p.newest_offset - position, 0)
            rows.append((p.partition, position, p.newest_offset, lag))
    if as_json:
        for partition, position, newest, lag in rows:
            print(
                json.dumps(
                    {
                        "cursor": cursor_id,
                        "stream": stream,
                        "partition": partition,
                        "position": position,
                        "newest": newest,
                        "lag": lag,
                    }
                )
            )
        return
    table = Table("partition", "position", "newest", "lag")
    for partition, position, newest, lag in rows:
        table.add_row(str(partition), str(position), str(newest), "-" if lag is None else str(lag))
    out.print(table)
    known = [lag for *_, lag in rows if lag is not None]
    out.print(f"lag {sum(known)} on {len(known)} of {len(rows)} partitions")


# The view and query commands (view_commands.py), listed after the commands above as before.
app.add_typer(view_app, name="view")
app.add_typer(query_app, name="query")
app.add_typer(site_app, name="site")
app.add_typer(cluster_app, name="cluster")
app.add_typer(token_app, name="token")


def main() -> None:
    app()
