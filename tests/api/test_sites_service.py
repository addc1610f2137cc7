"""The site RPCs of ``tidelog.v1`` through the client, against real servers: one started with a
site id, one without (docs/replication.md)."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.server import ServerProcess, served

import tidelog
from tidelog.client import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from tidelog.sites.envelope import decode, split_position
from tidelog.sites.send_queue import QUEUE_SEGMENT_BYTES


@pytest.fixture(scope="module")
def site_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("site")) / "data", "--site-id", "a") as process:
        yield process


def test_sites_are_declared_listed_and_kept_across_a_restart(site_server: ServerProcess) -> None:
    with tidelog.Client(site_server.address) as client:
        b = client.add_site("b", "127.0.0.1:9301")
        c = client.add_site("c", "127.0.0.1:9302")
        assert (b.number, c.number) == (0, 1)
        with pytest.raises(AlreadyExists):
            client.add_site("b", "127.0.0.1:9301")
        with pytest.raises(InvalidArgument, match="own id"):
            client.add_site("a", "127.0.0.1:9300")
        local, sites = client.list_sites()
        assert local == "a" and [s.site_id for s in sites] == ["b", "c"]
    site_server.restart()
    with tidelog.Client(site_server.address) as client:
        assert [s.site_id for s in client.list_sites()[1]] == ["b", "c"]
        client.remove_site("c")
        with pytest.raises(NotFound, match="unknown site 'c'"):
            client.remove_site("c")
        client.add_site("c", "127.0.0.1:9302")


def test_transmit_stores_each_payload_once_for_its_sites(site_server: ServerProcess) -> None:
    with tidelog.Client(site_server.address) as client:
        for site, port in (("x1", 9311), ("x2", 9312)):
            client.add_site(site, f"127.0.0.1:{port}")
        first = client.transmit("orders", b"one", ["x1"])
        many = client.transmit_many("orders", [(b"two", ["x1", "x2"]), (b"three", ["x2"])])
        assert [split_position(p)[1] for p in many] == [0, 1]
        assert split_position(many[0])[0] == split_position(first)[0] + 1
        with pytest.raises(NotFound, match="unknown site 'nowhere'"):
            client.transmit("orders", b"lost", ["x1", "nowhere"])
        with pytest.raises(InvalidArgument, match="this site"):
            client.transmit("orders", b"lost", ["a"])
        with pytest.raises(InvalidArgument, match="at least one destination"):
            client.transmit("orders", b"lost", [])
        # The queue is an internal stream: readable, and it holds the three payloads only.
        values = [m.value for m in client.subscribe("__lrq_delta", start="earliest", stop="latest")]
        payloads = [e.payload for v in values for e in decode(v).entries]
        assert payloads[-3:] == [b"one", b"two", b"three"]
        assert b"lost" not in payloads


def test_without_a_site_id_the_site_calls_say_how_to_enable_them(tmp_path: Path) -> None:
    with served(tmp_path / "data") as process, tidelog.Client(process.address) as client:
        with pytest.raises(FailedPrecondition, match="--site-id"):
            client.list_sites()
        with pytest.raises(FailedPrecondition, match="--site-id"):
            client.transmit("orders", b"x", ["b"])
        assert "__lrq_delta" not in [s.name for s in client.list_streams()]


def test_site_lag_and_state_are_prometheus_metrics(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    with socket.socket() as probe:  # an address where no site listens
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    data = tmp_path / "data"
    with served(data, "--site-id", "a", "--metrics-port", str(metrics_port)) as process:
        with tidelog.Client(process.address) as client:
            client.add_site("far", dead)
            client.transmit_many("orders", [(b"%d" % i, ["far"]) for i in range(3)])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
    assert 'tidelog_site_lag_entries{site="far"} 3.0' in text
    assert 'tidelog_site_stalled{site="far"} 1.0' in text
    assert 'tidelog_site_caught_up{site="far"} 0.0' in text
    assert 'tidelog_site_acked_position{site="far"} -1.0' in text
    assert re.search(r'tidelog_site_state\{site="far",state="[a-z_]+"\} 1\.0', text)


def test_sites_declared_in_the_settings_file(tmp_path: Path) -> None:
    config = tmp_path / "site.toml"
    config.write_text('site_id = "a"\n[sites]\nb = "127.0.0.1:9301"\nc = "127.0.0.1:9302"\n')
    data = tmp_path / "data"
    with served(data, "--config", str(config)) as process:
        with tidelog.Client(process.address) as client:
            local, sites = client.list_sites()
            assert local == "a"
            assert [(s.site_id, s.address) for s in sites] == [
                ("b", "127.0.0.1:9301"),
                ("c", "127.0.0.1:9302"),
            ]
            numbers = {s.site_id: s.number for s in sites}
        # b moved: the file's address wins, its number (and so its entries) stay.
        config.write_text('site_id = "a"\n[sites]\nb = "127.0.0.1:9400"\n')
        process.restart()
        with tidelog.Client(process.address) as client:
            moved = {s.site_id: s for s in client.list_sites()[1]}
            assert moved["b"].address == "127.0.0.1:9400"
            assert moved["b"].number == numbers["b"]
            assert "c" in moved  # declared before, kept: the file adds, it does not remove


def test_sites_without_a_site_id_are_refused_at_start(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[sites]\nb = "127.0.0.1:9301"\n')
    with (
        pytest.raises(RuntimeError, match="site_id is not set"),
        served(tmp_path / "data", "--config", str(config)),
    ):
        pass


def test_the_delta_queue_takes_its_retention_backstop_from_the_settings(tmp_path: Path) -> None:
    config = tmp_path / "site.toml"
    config.write_text(
        'site_id = "a"\nsites_queue_retention_bytes = 1048576\n'
        "sites_queue_retention_age_s = 3600.0\n"
    )
    data = tmp_path / "data"
    metadata = data / "streams" / "__lrq_delta" / "stream.json"
    with served(data, "--config", str(config)) as process:
        stored = json.loads(metadata.read_text())["config"]
        assert (stored["retention_bytes"], stored["retention_age_s"]) == (1048576, 3600.0)
        assert stored["segment_max_bytes"] == QUEUE_SEGMENT_BYTES
        # Changed between two starts: the stored queue takes the new bound.
        config.write_text('site_id = "a"\nsites_queue_retention_bytes = 2097152\n')
        process.restart()
        stored = json.loads(metadata.read_text())["config"]
        assert (stored["retention_bytes"], stored["retention_age_s"]) == (2097152, None)
