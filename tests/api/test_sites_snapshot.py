"""Snapshot sync between real servers (docs/replication.md): a source application's state reaches
a sink application whole when deltas cannot - retention trimmed past the sink's position, or an
operator asked for a resync while deltas flowed - and deltas resume after the position the
snapshot covers, with no gap and no duplicate."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.support.server import ServerProcess, served

import tidelog
from tidelog.client import RoutedMessage, SnapshotRequest

DEADLINE_S = 60.0
TRIMMING = {  # the source keeps its queues short: a few records, trimmed every 0.1 s
    "TIDELOG_SEGMENT_MAX_BYTES": "4096",
    "TIDELOG_RETENTION_MESSAGES": "20",
    "TIDELOG_MAINTENANCE_INTERVAL_S": "0.1",
}


class SourceApp:
    """A key-value table replicated to site b: each put updates the table, then transmits."""

    def __init__(self, client: tidelog.Client) -> None:
        self.client = client
        self.table: dict[str, str] = {}
        self.lock = threading.Lock()
        self.positions: list[int] = []

    def put_many(self, pairs: list[tuple[str, str]]) -> None:
        with self.lock:
            for key, value in pairs:
                self.table[key] = value
            items = [(f"{k}={v}".encode(), ["b"]) for k, v in pairs]
            self.positions += self.client.transmit_many("kv", items)

    def provide(self, request: SnapshotRequest) -> list[tuple[str, bytes]]:
        assert request.site_id == "b"
        with self.lock:
            return [("kv", f"{k}={v}".encode()) for k, v in self.table.items()]


@dataclass
class SinkApp:
    """Site b's copy of the table, and every event the listener delivered."""

    table: dict[str, str] = field(default_factory=dict)
    events: list[RoutedMessage] = field(default_factory=list)

    def on_entry(self, entry: RoutedMessage) -> None:
        self.events.append(entry)
        if entry.kind == "snapshot_start":
            self.table.clear()  # a snapshot replaces what this source sent
        elif entry.kind in ("snapshot_entry", "delta"):
            key, value = entry.payload.decode().split("=", 1)
            self.table[key] = value

    def deltas_after_last_snapshot(self) -> tuple[int, list[int]]:
        """The last applied snapshot's covered position, and the delta positions after it."""
        ends = [i for i, e in enumerate(self.events) if e.kind == "snapshot_end"]
        assert ends, "no snapshot reached the sink application"
        end = self.events[ends[-1]]
        return end.position, [e.position for e in self.events[ends[-1] + 1 :]]


def wait_until_equal(source: SourceApp, sink: SinkApp) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        with source.lock:
            if sink.table == source.table:
                return
        time.sleep(0.1)
    with source.lock:
        missing = {k for k in source.table if sink.table.get(k) != source.table[k]}
    raise AssertionError(
        f"the sink's table differs on {len(missing)} keys, e.g. {sorted(missing)[:5]}; "
        f"the source says {source.client.site_status()}"
    )


def assert_deltas_resume_exactly(source: SourceApp, sink: SinkApp) -> None:
    covered, after = sink.deltas_after_last_snapshot()
    assert after == sorted(set(after)), "deltas after the snapshot: in order, no duplicate"
    assert after == [p for p in source.positions if p > covered], "and no gap"


@contextlib.contextmanager
def two_sites(root: Path, **source_env: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with (
        served(root / "a", "--site-id", "a", env=source_env or None) as a,
        served(root / "b", "--site-id", "b") as b,
    ):
        with tidelog.Client(a.address) as client:
            client.add_site("b", b.address)
        yield a, b


@pytest.fixture
def trimming(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with two_sites(tmp_path, **TRIMMING) as pair:
        yield pair


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with two_sites(tmp_path) as pair:
        yield pair


def test_a_sink_behind_a_trim_gets_a_snapshot_then_deltas(
    trimming: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = trimming
    sink = SinkApp()
    with tidelog.Client(a.address) as client:
        source = SourceApp(client)
        with client.snapshot_provider(source.provide) as provider:
            with tidelog.Client(b.address) as at_b, at_b.routing_listener("kv", sink.on_entry):
                source.put_many([(f"early-{i}", "1") for i in range(50)])
                wait_until_equal(source, sink)
            b.kill()
            # Written while b is down, then trimmed away by the source's retention: deltas
            # alone would never bring these keys to b.
            source.put_many([(f"late-{i}", "2") for i in range(50)])
            for round_ in range(60):
                source.put_many([(f"filler-{round_ % 7}", f"{round_:0300d}")])
            deadline = time.monotonic() + DEADLINE_S
            while min(m.offset for m in _first_of(client, "__lrq_delta")) < 10:
                assert time.monotonic() < deadline, "retention did not trim the delta queue"
                time.sleep(0.1)
            b.extra += ["--port", str(b.port)]
            b.start()
            with tidelog.Client(b.address) as at_b, at_b.routing_listener("kv", sink.on_entry):
                wait_until_equal(source, sink)
                source.put_many([(f"after-{i}", "3") for i in range(20)])
                wait_until_equal(source, sink)
            assert [r.site_id for r in provider.provided] == ["b"]
            status = {s.site_id: s for s in client.site_status()}["b"]
    assert status.state == "log_entry_sync"
    # Until the deltas after it are acknowledged the reason names the snapshot; then, caught up.
    assert "snapshot" in status.reason or (status.caught_up and "caught up" in status.reason)
    kinds = [e.kind for e in sink.events]
    assert kinds.count("snapshot_start") == kinds.count("snapshot_end") == 1
    assert_deltas_resume_exactly(source, sink)


def test_a_resync_while_deltas_flow_replaces_the_state_and_loses_nothing(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    sink = SinkApp()
    with tidelog.Client(a.address) as client:
        source = SourceApp(client)
        with (
            client.snapshot_provider(source.provide) as provider,
            tidelog.Client(b.address) as at_b,
            at_b.routing_listener("kv", sink.on_entry),
        ):
            for round_ in range(150):
                source.put_many([(f"k{(round_ * 10 + i) % 97}", str(round_)) for i in range(10)])
                if round_ == 40:
                    client.resync_site("b")
                if round_ == 100:  # the second once the first is applied: two snapshots
                    _wait_for_snapshots(sink, 1)
                    # The source learns of the apply just after the sink's listener sees it; a
                    # resync before that is the first one (coalesced), not a second.
                    deadline = time.monotonic() + DEADLINE_S
                    while not client.resync_site("b"):
                        assert time.monotonic() < deadline, "the first snapshot never ended"
                        time.sleep(0.05)
            wait_until_equal(source, sink)
            assert len(provider.provided) == 2
    kinds = [e.kind for e in sink.events]
    assert kinds.count("snapshot_start") == kinds.count("snapshot_end") == 2
    assert_deltas_resume_exactly(source, sink)


def _wait_for_snapshots(sink: SinkApp, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while sum(e.kind == "snapshot_end" for e in list(sink.events)) < count:
        assert time.monotonic() < deadline, f"{count} snapshot(s) did not reach the sink"
        time.sleep(0.05)


def _first_of(client: tidelog.Client, stream: str) -> list[tidelog.client.ReceivedMessage]:
    for message in client.subscribe(stream, start="earliest", stop="latest"):
        return [message]
    raise AssertionError(f"{stream} is empty")


def test_a_sink_killed_mid_snapshot_gets_a_whole_one_after_its_restart(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    started = threading.Event()

    def slow_provide(request: SnapshotRequest) -> Iterator[tuple[str, bytes]]:
        """20,000 entries over about two seconds: long enough to kill the sink inside it."""
        for i in range(20_000):
            if i % 1000 == 999:
                started.set()
                time.sleep(0.1)
            yield "kv", f"s{i}={request.snapshot}".encode()

    with (
        tidelog.Client(a.address) as client,
        client.snapshot_provider(slow_provide) as provider,
    ):
        client.resync_site("b")
        assert started.wait(DEADLINE_S), "the provider was never asked"
        time.sleep(0.3)
        b.kill()  # kill -9 with part of the snapshot in its receive queue
        b.extra += ["--port", str(b.port)]
        b.start()
        deadline = time.monotonic() + DEADLINE_S
        while not provider.provided or not _caught_up(client):
            assert time.monotonic() < deadline, f"no whole snapshot: {client.site_status()}"
            time.sleep(0.2)
        last = provider.provided[-1].snapshot
    sink = SinkApp()
    with tidelog.Client(b.address) as at_b, at_b.routing_listener("kv", sink.on_entry):
        deadline = time.monotonic() + DEADLINE_S
        while not any(e.kind == "snapshot_end" for e in list(sink.events)):
            assert time.monotonic() < deadline, "the sink application got no snapshot end"
            time.sleep(0.1)
    # The broken transfer's start is followed by a new start: what the listener holds after the
    # end is the whole snapshot, nothing of the broken one.
    assert sink.table == {f"s{i}": str(last) for i in range(20_000)}
    kinds = [e.kind for e in sink.events]
    assert kinds.count("snapshot_end") == 1
    assert kinds.count("snapshot_start") == 2, "the broken transfer's start, then the whole one"
    assert [r.snapshot for r in provider.provided] == [last], "the broken one was given up"


def _caught_up(client: tidelog.Client) -> bool:
    return all(s.state == "log_entry_sync" for s in client.site_status())


def test_a_sink_that_stops_acking_gets_resends_then_a_snapshot(tmp_path: Path) -> None:
    """SIGSTOP the sink: its batches go unacknowledged through the resends, the source starts a
    snapshot sync on its own (no resync asked, nothing trimmed), and once the sink runs again it
    ends with the source's table and the deltas after the snapshot, exactly."""
    with two_sites(tmp_path, TIDELOG_SITES_ACK_TIMEOUT_S="0.3") as (a, b):
        sink = SinkApp()
        with tidelog.Client(a.address) as client:
            source = SourceApp(client)
            with client.snapshot_provider(source.provide) as provider:
                source.put_many([(f"k{i}", "0") for i in range(20)])
                deadline = time.monotonic() + DEADLINE_S
                while not _caught_up(client):
                    assert time.monotonic() < deadline, "b never caught up"
                    time.sleep(0.1)
                os.kill(b.pid, signal.SIGSTOP)
                try:
                    source.put_many([(f"k{i}", "1") for i in range(20)])
                    deadline = time.monotonic() + DEADLINE_S
                    while not provider.provided and "snapshot" not in _reason(client):
                        assert time.monotonic() < deadline, f"no snapshot: {client.site_status()}"
                        time.sleep(0.1)
                finally:
                    os.kill(b.pid, signal.SIGCONT)
                with tidelog.Client(b.address) as at_b, at_b.routing_listener("kv", sink.on_entry):
                    wait_until_equal(source, sink)
                    source.put_many([(f"after-{i}", "2") for i in range(10)])
                    wait_until_equal(source, sink)
                    deadline = time.monotonic() + DEADLINE_S
                    while not _caught_up(client):
                        assert time.monotonic() < deadline, f"not caught up: {client.site_status()}"
                        time.sleep(0.1)
                assert provider.provided, "the timeouts started a snapshot the provider answered"
    assert_deltas_resume_exactly(source, sink)


def _reason(client: tidelog.Client) -> str:
    return " ".join(s.reason for s in client.site_status())
