"""``tidelog site``: declare the remote sites this site replicates to, and transmit payloads
(``docs/replication.md``; the server must run with ``--site-id``)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tidelog.cli.common import PLAINTEXT, ServerOption, client_command, guarded, out
from tidelog.client import DEFAULT_SERVER, ClientTls

site_app = typer.Typer(
    help="Multi-site replication: declare remote sites, transmit payloads to them.",
    no_args_is_help=True,
)


@site_app.command("add")
@client_command
def site_add(
    site_id: str,
    address: str,
    server: ServerOption = DEFAULT_SERVER,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Declare remote site SITE_ID, whose tidelog server listens at ADDRESS (HOST:PORT)."""
    with guarded(server, credentials) as client:
        site = client.add_site(site_id, address)
    out.print(f"added site [bold]{site.site_id}[/bold] at {site.address} (number {site.number})")


@site_app.command("remove")
@client_command
def site_remove(
    site_id: str, server: ServerOption = DEFAULT_SERVER, credentials: ClientTls = PLAINTEXT
) -> None:
    """Forget a remote site: nothing more is sent to it."""
    with guarded(server, credentials) as client:
        client.remove_site(site_id)
    out.print(f"removed site [bold]{site_id}[/bold]")


@site_app.command("list")
@client_command
def site_list(
    server: ServerOption = DEFAULT_SERVER,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per site")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """This site's id and the remote sites it replicates to."""
    with guarded(server, credentials) as client:
        local, sites = client.list_sites()
    if as_json:
        for site in sites:
            print(
                json.dumps(
                    {
                        "site_id": site.site_id,
                        "address": site.address,
                        "number": site.number,
                        "since": site.since,
                    }
                )
            )
        return
    table = Table(title=f"remote sites of {local}")
    for column in ("site", "address", "number", "since offset"):
        table.add_column(column)
    for site in sites:
        table.add_row(site.site_id, site.address, str(site.number), str(site.since))
    out.print(table)


@site_app.command("status")
@client_command
def site_status(
    server: ServerOption = DEFAULT_SERVER,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per site")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Each remote site's sync state, last acknowledged position and lag: caught up, behind,
    or stalled (entries outstanding and no acknowledgement for 10 s)."""
    with guarded(server, credentials) as client:
        states = client.site_status()
    if as_json:
        for s in states:
            print(json.dumps(dataclasses.asdict(s)))
        return
    table = Table(title="remote sites")
    for column in ("site", "state", "acked", "lag (entries)", "lag (s)", "health", "reason"):
        table.add_column(column)
    for s in states:
        health = "caught up" if s.caught_up else "STALLED" if s.stalled else "behind"
        table.add_row(
            s.site_id,
            s.state,
            str(s.acked),
            str(s.lag_entries),
            f"{s.lag_seconds:.1f}",
            health,
            "" if s.caught_up else s.reason,
        )
    out.print(table)


@site_app.command("resync")
@client_command
def site_resync(
    site_id: str, server: ServerOption = DEFAULT_SERVER, credentials: ClientTls = PLAINTEXT
) -> None:
    """Start a snapshot sync of remote site SITE_ID: this site's snapshot provider sends its
    application's state, then deltas resume (watch it with `tidelog site status`)."""
    with guarded(server, credentials) as client:
        started = client.resync_site(site_id)
    if not started:
        out.print(
            f"a snapshot sync of site [bold]{site_id}[/bold] is asked for or under way "
            f"already: none started (that one sends the state)"
        )
        return
    out.print(
        f"snapshot sync of site [bold]{site_id}[/bold] requested; it needs this site's "
        f"snapshot provider running (client.snapshot_provider)"
    )


@site_app.command("transmit")
@client_command
def site_transmit(
    client_name: str,
    destinations: Annotated[str, typer.Argument(help="destination site ids, comma-separated")],
    value: Annotated[
        str | None, typer.Argument(help="the payload as text; omit to read lines from --file")
    ] = None,
    file: Annotated[
        Path | None, typer.Option(help="one payload per line of this file ('-': stdin)")
    ] = None,
    server: ServerOption = DEFAULT_SERVER,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Store payloads once for the given sites: VALUE, or each line of --file, in one call."""
    sites = [d for d in destinations.split(",") if d]
    if value is not None:
        payloads = [value.encode()]
    elif file is not None:
        source = sys.stdin.buffer if str(file) == "-" else file.open("rb")
        with source:
            payloads = [line.rstrip(b"\n") for line in source]
    else:
        payloads = []
    with guarded(server, credentials) as client:
        positions = client.transmit_many(client_name, [(p, sites) for p in payloads])
    out.print(f"transmitted {len(positions)} payloads to {', '.join(sites)}")
