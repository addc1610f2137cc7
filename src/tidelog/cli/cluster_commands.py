"""``tidelog cluster``: a cluster's brokers and partitions, and moving a partition's replicas
(``docs/cluster.md``; the server must be one broker of a cluster)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from tidelog.cli.common import PLAINTEXT, ServerOption, client_command, fail, guarded, out
from tidelog.client import DEFAULT_SERVER, ClientTls, PartitionReplicas

cluster_app = typer.Typer(
    help="A cluster of brokers: status, and moving partitions between brokers.",
    no_args_is_help=True,
)


def _lags(p: PartitionReplicas) -> str:
    parts = []
    for member in p.replicas:
        if member == p.leader:
            continue
        mark = "" if member in p.isr else " (out of ISR)"
        if any(f.broker_id == member and f.down for f in p.followers):
            parts.append(f"{member}: [red]down[/red]{mark}")
            continue
        lag = p.lag(member)
        parts.append(f"{member}: {'?' if lag is None else lag}{mark}")
    return ", ".join(parts) or "-"


@cluster_app.command("status")
@client_command
def cluster_status(
    stream: Annotated[str, typer.Argument(help="only this stream")] = "",
    server: ServerOption = DEFAULT_SERVER,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Brokers (and which is the controller), then each partition's leader, replicas, ISR,
    high watermark and each follower's lag in records behind the leader."""
    with guarded(server, credentials) as client:
        status = client.cluster_status(stream)
    if as_json:
        print(json.dumps(dataclasses.asdict(status)))
        return
    brokers = Table(title=f"cluster {status.cluster} (answered by {status.answered_by})")
    for column in ("broker", "address", "role"):
        brokers.add_column(column)
    for b in status.brokers:
        role = "[red]down[/red]" if b.down else "controller" if b.controller else ""
        brokers.add_row(b.broker_id, b.address or "-", role)
    out.print(brokers)
    table = Table(title="partitions")
    for column in ("partition", "leader", "epoch", "replicas", "ISR", "min ISR", "HW", "lag"):
        table.add_column(column)
    for p in status.partitions:
        replicas = ",".join(p.replicas) + (f" -> {','.join(p.target)}" if p.target else "")
        under = len(p.isr) < p.min_isr
        table.add_row(
            f"{p.stream}/{p.partition}",
            p.leader or "[red]none[/red]",
            str(p.leader_epoch),
            replicas,
            ("[red]" if under else "") + ",".join(p.isr) + ("[/red]" if under else ""),
            str(p.min_isr),
            "?" if p.high_watermark < 0 else str(p.high_watermark),
            _lags(p),
        )
    out.print(table)


@cluster_app.command("reassign")
@client_command
def cluster_reassign(
    stream: str,
    partition: int,
    replicas: Annotated[
        str,
        typer.Option("--replicas", help="the broker ids to hold the partition, comma-separated"),
    ],
    server: ServerOption = DEFAULT_SERVER,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="show progress until the move is done")
    ] = True,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the move [600]")] = 600.0,
    credentials: ClientTls = PLAINTEXT,
) -> None:
    """Move STREAM's PARTITION to the brokers in --replicas: the new ones copy the log and join
    the ISR, then the others leave (a leader that leaves hands over first)."""
    wanted = [r.strip() for r in replicas.split(",") if r.strip()]
    with guarded(server, credentials) as client:
        started = client.reassign(stream, partition, wanted)
        leaving = ",".join(r for r in started.replicas if r not in wanted) or "-"
        out.print(f"moving {stream}/{partition} from {leaving} to {','.join(wanted)}")
        if not wait:
            return
        deadline = time.monotonic() + timeout
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[state]}")
        ) as progress:
            tasks = {
                member: progress.add_task(f"{member}", total=1, state="")
                for member in wanted
                if member != started.leader
            }
            while True:
                (now,) = [
                    p for p in client.cluster_status(stream).partitions if p.partition == partition
                ]
                for member, task in tasks.items():
                    lag = now.lag(member)
                    total = max(now.log_end, 1)
                    done = total if lag is None else total - lag
                    state = (
                        "in ISR" if member in now.isr else f"{'?' if lag is None else lag} behind"
                    )
                    progress.update(task, total=total, completed=done, state=state)
                if not now.target:
                    break
                if time.monotonic() > deadline:
                    fail(f"still moving after {timeout:g} s: see `tidelog cluster status`")
                time.sleep(0.5)
    out.print(f"{stream}/{partition}: replicas {','.join(now.replicas)}, leader {now.leader}")
