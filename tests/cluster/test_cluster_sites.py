"""A site run by a cluster (docs/cluster.md, docs/replication.md): its queues, registry and sink
progress are replicated, one broker (the delta queue's leader) runs it, and the others hand its
calls over. kill -9 of that broker while entries flow both ways loses no acknowledged entry and
applies none twice."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
from tests.cluster.clustertools import Cluster, running_cluster, wait_for
from tests.support.server import served

import tidelog
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.errors import TidelogError
from tidelog.sites.send_queue import DELTA_QUEUE
from tidelog.sites.sink import POSITION_HEADER, receive_queue
from tidelog.wire import KIND_HEADER

SITES = {"TIDELOG_SITES_ACK_TIMEOUT_S": "2"}
SMALL_SEGMENTS = {"TIDELOG_SEGMENT_MAX_BYTES": "4096", "TIDELOG_MAINTENANCE_INTERVAL_S": "0.3"}
"""A delta queue of many small segments, released often once acknowledged."""
DEADLINE_S = 90.0


def gateway(cluster: Cluster) -> str:
    """The broker that runs the cluster's site: its delta queue's leader, once it runs it."""

    def running() -> str | None:
        leader = cluster.partition(DELTA_QUEUE).leader
        if not leader or not cluster.alive(leader):
            return None
        answer = cluster.v1(leader).ListSites(v1.ListSitesRequest(), timeout=2)
        return leader if answer.local_site == "a" else None

    return wait_for(running, 60, "the cluster's site to run")


def received(address: str, client: str, source: str) -> list[tuple[int, bytes]]:
    """(position, payload) of every record of a receive queue, read through ``address``."""
    return [
        (position, payload)
        for _, position, payload in records(address, receive_queue(client, source))
    ]


class Transmitter(threading.Thread):
    """Transmits ``count`` numbered payloads to ``destination`` in calls of 50 through
    ``address()``, again after a failed call (its entries may or may not be stored); keeps the
    payloads of the calls that were acknowledged."""

    def __init__(self, address: object, prefix: bytes, destination: str, count: int) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.prefix = prefix
        self.destination = destination
        self.count = count
        self.acked: list[bytes] = []
        self.sent: list[bytes] = []
        self.failures: list[str] = []
        self.progress = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        at = 0
        while at < self.count and time.monotonic() < deadline:
            batch = [self.prefix + b"%06d" % n for n in range(at, min(at + 50, self.count))]
            self.sent += batch
            try:
                with tidelog.Client(self.address()) as client:  # type: ignore[operator]
                    client.transmit_many("app", [(p, [self.destination]) for p in batch])
            except (TidelogError, grpc.RpcError) as error:
                self.failures.append(str(error))
                time.sleep(0.2)
                continue
            self.acked += batch
            at += len(batch)
            if len(self.acked) >= 300:
                self.progress.set()


def check_exactly_once(got: list[tuple[int, bytes]], sent: list[bytes], acked: list[bytes]) -> None:
    """Each position applied once, in order; every acknowledged payload there; a payload more
    than once only as often as it was sent (a failed call sent again may have been stored: a
    transmit is not idempotent); payloads in the order they were first sent."""
    positions = [p for p, _ in got]
    assert positions == sorted(set(positions)), "a position was applied twice, or out of order"
    payloads = [p for _, p in got]
    assert not set(acked) - set(payloads), "an acknowledged entry was lost"
    sent_times = Counter(sent)
    assert all(n <= sent_times[p] for p, n in Counter(payloads).items()), "applied twice"
    firsts = list(dict.fromkeys(payloads))
    assert firsts == sorted(firsts), "out of order"


def test_killing_the_broker_that_runs_a_clusters_site_loses_nothing(tmp_path: Path) -> None:
    with (
        served(tmp_path / "b", "--site-id", "b", env=SITES) as b,
        running_cluster(
            tmp_path / "a", 3, env={"TIDELOG_SITE_ID": "a", **SITES, **SMALL_SEGMENTS}
        ) as cluster,
    ):
        first = gateway(cluster)
        other = next(x for x in sorted(cluster.servers) if x != first)
        entry = cluster.servers[other].address
        # Declared through a broker that does not run the site: handed to the one that does.
        with tidelog.Client(entry) as client:
            client.add_site("b", b.address)
            assert [s.site_id for s in client.list_sites()[1]] == ["b"]
        # The sink side: b's sender reaches the cluster through the same broker, relayed.
        with tidelog.Client(b.address) as client:
            client.add_site("a", entry)

        out = Transmitter(lambda: entry, b"a>b-", "b", 1500)
        into = Transmitter(lambda: b.address, b"b>a-", "a", 1500)
        out.start()
        into.start()
        assert out.progress.wait(60) and into.progress.wait(60), cluster.logs()
        # Created while one broker was live, the site's streams widen to three replicas.
        site_streams = [DELTA_QUEUE, "__lrq_state", receive_queue("app", "b")]
        wait_for(
            lambda: all(len(cluster.partition(s).isr) == 3 for s in site_streams),
            60,
            "the site's streams to have three replicas in sync",
        )
        cluster.kill(first)  # kill -9 of the site's broker while entries flow both ways
        out.join(DEADLINE_S + 10)
        into.join(DEADLINE_S + 10)
        print(f"failed calls: {len(out.failures)} out, {len(into.failures)} in; killed {first}")
        assert len(out.acked) == 1500 and len(into.acked) == 1500, (
            out.failures[-3:],
            into.failures[-3:],
            cluster.logs(),
        )
        second = gateway(cluster)
        assert second != first

        def arrived(address: str, source: str, count: int) -> list[tuple[int, bytes]] | None:
            got = received(address, "app", source)
            return got if len(got) >= count else None

        to_b = wait_for(lambda: arrived(b.address, "a", 1500), DEADLINE_S, "a's entries at b")
        check_exactly_once(to_b, out.sent, out.acked)
        to_a = wait_for(lambda: arrived(entry, "b", 1500), DEADLINE_S, "b's entries at a")
        check_exactly_once(to_a, into.sent, into.acked)

        # Acknowledged entries leave the delta queue on the broker that runs the site, and on
        # its followers too (the leader's log start travels with each fetch answer).
        def segments(broker_id: str) -> int:
            directory = cluster.root / broker_id / "streams" / DELTA_QUEUE / "0"
            return len(list(directory.glob("*.log")))

        survivors = [x for x in sorted(cluster.servers) if x != first]
        assert all(segments(x) > 0 for x in survivors)
        wait_for(
            lambda: all(segments(x) <= 2 for x in survivors),
            30,
            f"acknowledged segments released everywhere: {[segments(x) for x in survivors]}",
        )
        # The registry moved with the site, and the new broker reports its state.
        with tidelog.Client(entry) as client:
            assert [s.site_id for s in client.list_sites()[1]] == ["b"]
            states = client.site_status()
        assert [s.site_id for s in states] == ["b"]


def succeeds(call: Callable[[], object]) -> bool:
    """Whether ``call`` returned (a refusal while the site moves: no)."""
    try:
        call()
    except TidelogError:
        return False
    return True


def records(address: str, name: str) -> list[tuple[bytes, int, bytes]]:
    """(kind, position, payload) of every record of a receive queue (kind ``delta`` for
    deltas)."""
    with tidelog.Client(address) as reader:
        if name not in {s.name for s in reader.list_streams()}:
            return []
        if reader.stream_info(name).partitions[0].high_watermark < 0:
            return []
        return [
            (
                m.headers.get(KIND_HEADER, b"delta"),
                int.from_bytes(m.headers[POSITION_HEADER], "big"),
                m.value,
            )
            for m in reader.subscribe(name, start="earliest", stop="latest")
        ]


def test_snapshots_reach_a_cluster_and_leave_one_across_a_kill_of_the_site_broker(
    tmp_path: Path,
) -> None:
    """The cluster as a sink: b's snapshot is applied by a's gateway, which is then killed;
    deltas go on into the new one with no second snapshot, no gap and no duplicate. The
    cluster as a source: a snapshot asked through a broker that does not run the site, from a
    provider connected to that broker, reaches b, before and after the kill."""
    with (
        served(tmp_path / "b", "--site-id", "b", env=SITES) as b,
        running_cluster(tmp_path / "a", 3, env={"TIDELOG_SITE_ID": "a", **SITES}) as cluster,
    ):
        first = gateway(cluster)
        entry = cluster.servers[next(x for x in sorted(cluster.servers) if x != first)].address
        with tidelog.Client(entry) as client:
            client.add_site("b", b.address)
        with tidelog.Client(b.address) as client:
            client.add_site("a", entry)
        into_a, into_b = receive_queue("kv", "b"), receive_queue("kv", "a")
        with (
            tidelog.Client(b.address) as at_b,
            tidelog.Client(entry) as at_a,
            at_b.snapshot_provider(lambda _: [("kv", b"b-state")]) as b_provider,
            at_a.snapshot_provider(lambda _: [("kv", b"a-state")]) as a_provider,
        ):
            b_positions = at_b.transmit_many("kv", [(b"b%03d" % i, ["a"]) for i in range(50)])
            at_b.resync_site("a")
            at_a.resync_site("b")  # through a broker that does not run the site
            ends = wait_for(
                lambda: [r for r in records(entry, into_a) if r[0] == b"snapshot_end"],
                60,
                "b's snapshot applied at a",
            )
            covered = ends[0][1]
            wait_for(
                lambda: any(r[0] == b"snapshot_end" for r in records(b.address, into_b)),
                60,
                "a's snapshot applied at b",
            )
            site_streams = [DELTA_QUEUE, "__lrq_state", into_a]
            wait_for(
                lambda: all(len(cluster.partition(s).isr) == 3 for s in site_streams),
                60,
                "the site's streams to have three replicas in sync",
            )
            cluster.kill(first)
            b_positions += at_b.transmit_many("kv", [(b"b%03d" % i, ["a"]) for i in range(50, 99)])
            got = wait_for(
                lambda: (found := records(entry, into_a)) and found[-1][2] == b"b098" and found,
                60,
                "b's deltas after the kill at a",
            )
            assert len(b_provider.provided) == 1, "the new gateway knew the snapshot applied"
            after = [p for kind, p, _ in got[got.index(ends[0]) + 1 :] if kind == b"delta"]
            assert after == [p for p in b_positions if p > covered], "no gap, no duplicate"
            gateway(cluster)
            with tidelog.Client(entry) as client:
                wait_for(lambda: succeeds(lambda: client.resync_site("b")), 30, "a resync")
            wait_for(
                lambda: sum(r[0] == b"snapshot_end" for r in records(b.address, into_b)) == 2,
                60,
                "a second snapshot of a at b, from the new gateway",
            )
            assert len(a_provider.provided) == 2
