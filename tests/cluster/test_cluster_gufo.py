"""gufo-liftbridge, an existing Liftbridge client, unchanged, against a cluster: its subscription
follows the partition's leader when the leader moves (the leader is stopped, as in a rolling
restart: gufo refreshes metadata and resubscribes after the last offset it got), and its
publishes, sent to whichever broker it picks, are stored once by the leader.

Not tested with kill -9: gufo then keeps reconnecting to the dead leader for ever when the
metadata it refreshes to still names it (before the dead broker's lease expires), whatever the
brokers answer later; and it asks only its first seed for metadata (docs/cluster.md,
"Clients")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.cluster.clustertools import running_cluster, wait_for

from tidelog.client import Client, ClientSettings

pytestmark = pytest.mark.slow  # etcd and three brokers on loopback

CHILD = Path(__file__).with_name("gufo_follower.py")


def test_gufo_follows_a_leader_move(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        cluster.create_stream("s", replication_factor=3, min_isr=2)
        leader = cluster.partition("s").leader
        # gufo asks only the seed it first connected to for metadata, for ever: seeded with the
        # leader it could never learn of another (docs/cluster.md, "Clients").
        seeds = [s.address for b, s in cluster.servers.items() if b != leader]
        child = subprocess.Popen(
            [sys.executable, str(CHILD), "200", "5", *seeds],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            settings = ClientSettings(ack_all=True, retry_budget_s=30)
            with Client(seeds[0], settings=settings) as client:
                for n in range(100):
                    client.publish_batch("s", [b"v%d" % n], producer_id="p", producer_sequence=n)
                time.sleep(1.0)  # the subscriber is reading from the leader
                assert cluster.servers[leader].stop() == 0
                for n in range(100, 200):
                    client.publish_batch("s", [b"v%d" % n], producer_id="p", producer_sequence=n)
            assert wait_for(lambda: cluster.partition("s").leader != leader, 30)
            out, err = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 0, err[-3000:]
    got = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    assert [offset for offset, _ in got] == list(range(205))
    assert [value for _, value in got[:200]] == [f"v{n}" for n in range(200)]
    assert sorted(value for _, value in got[200:]) == [f"gufo-{n}" for n in range(5)]
