"""The console's cluster page in a real headless Chromium against etcd and three brokers on
loopback (a standalone ``tidelog console`` asking one of them): every broker and the controller,
each partition's leader, replicas and ISR; a broker killed shows as out of sync, and a partition
left below its minIsr says so. Saved as docs/console/cluster.png."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from tests.cluster.clustertools import Cluster, running_cluster, wait_for
from tests.console.browsertools import Console, shot

from tidelog.client import Client, ClientSettings

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as running:
        running.create_stream("orders", partitions=3, replication_factor=3, min_isr=2)
        running.create_stream("audit", partitions=1, replication_factor=2, min_isr=2)
        with Client(running.servers["b1"].address, settings=ClientSettings(ack_all=True)) as c:
            for partition in range(3):
                c.publish_batch("orders", [b"o%d" % i for i in range(10)], partition=partition)
            c.publish_batch("audit", [b"a"] * 5)
        yield running


def test_the_cluster_page_shows_brokers_leaders_and_the_isr(cluster: Cluster, page: Page) -> None:
    console = Console(cluster.servers["b1"].address)
    try:
        page.goto(f"{console.url}/cluster")
        brokers = page.locator("#brokers tbody tr")
        expect(brokers).to_have_count(3)
        expect(page.locator("#brokers")).to_contain_text("controller")
        orders = page.locator("#partitions tbody tr", has_text="orders")
        expect(orders).to_have_count(3)
        for row in orders.all():
            expect(row).to_contain_text("★")  # a leader in every row
        expect(page.locator("#partitions")).not_to_contain_text("__cursors")
        shot(page, "cluster")

        # Kill a follower of "audit": it leaves the ISR, which falls below minIsr 2.
        audit = cluster.partition("audit")
        follower = next(b for b in audit.replicas if b != audit.leader)
        cluster.kill(follower)
        wait_for(lambda: follower not in cluster.partition("audit").isr, 30, "the ISR shrink")
        page.reload()
        row = page.locator("#partitions tbody tr", has_text="audit")
        expect(row).to_contain_text("below minIsr 2")
        expect(row.locator(".tag.bad", has_text=follower)).to_have_count(1)

        # once its lease ends, the killed broker stays in the brokers' table, down
        def shown_down() -> bool:
            page.reload()
            return "down" in brokers.filter(has_text=follower).inner_text()

        wait_for(shown_down, 30, "the killed broker shown down")
        expect(brokers).to_have_count(3)
        expect(brokers.filter(has_text=follower)).to_contain_text("down")
    finally:
        console.kill()
