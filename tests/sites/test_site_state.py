"""A site's documents (``tidelog/sites/site_state.py``): on a cluster, the registry and the
sink's snapshot progress are records of ``__lrq_state``, so the next broker to run the site reads
them; a change that cannot be saved is not made."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Stream, StreamConfig
from tidelog.errors import NotEnoughReplicas, SiteMoving
from tidelog.sites.local_site import LocalSite
from tidelog.sites.registry import SITES_FILE
from tidelog.sites.send_queue import Transmission
from tidelog.sites.sink import SnapshotFrame, local_streams
from tidelog.sites.site_state import STATE_STREAM, SiteFiles


def test_the_next_broker_to_run_a_site_reads_its_documents_from_the_state_stream(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            # The broker's own streams stand in for a cluster's replicated ones.
            streams = local_streams(broker)
            site = LocalSite(broker, "a", tmp_path, upkeep_interval_s=3600.0, streams=streams)
            await site.open({"c": "127.0.0.1:2"})
            await site.add_site("b", "127.0.0.1:1")
            await site.remove_site("c")
            frame = SnapshotFrame(5, 10, start=True, end=True, entries=[("app", b"x")])
            assert await site.sink.receive_snapshot("z", frame) == 5
            await site.close()
            assert not (tmp_path / SITES_FILE).exists(), "no file: the state stream"
            assert SiteFiles(tmp_path).load("sink") is None
            assert broker.find_stream(STATE_STREAM) is not None

            again = LocalSite(broker, "a", tmp_path, upkeep_interval_s=3600.0, streams=streams)
            await again.open()
            assert [s.site_id for s in again.sites()] == ["b"]
            progress = again.sink.progress("z")
            assert progress.snapshot_applied == 5 and progress.last_processed == 10

            async def full_disk(name: str, document: Any) -> None:
                raise OSError(28, "No space left on device")

            assert again._state is not None
            again._state.save = full_disk  # type: ignore[method-assign]
            with pytest.raises(OSError):
                await again.add_site("d", "127.0.0.1:3")
            with pytest.raises(OSError):
                await again.remove_site("b")
            assert [s.site_id for s in again.sites()] == ["b"], "unchanged"
            assert set(again.senders) == {"b"}
            await again.close()

    asyncio.run(main())


def test_a_single_brokers_site_keeps_its_files(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            site = LocalSite(broker, "a", tmp_path, upkeep_interval_s=3600.0)
            await site.open()
            await site.add_site("b", "127.0.0.1:1")
            await site.close()
            assert broker.find_stream(STATE_STREAM) is None
        assert SiteFiles(tmp_path).load("registry")["sites"][0]["site_id"] == "b"

    asyncio.run(main())


def test_a_site_declared_while_the_site_closes_gets_no_sender_left_running(
    tmp_path: Path,
) -> None:
    """On a cluster a declaration waits for the ISR; a close meanwhile (this broker no longer
    runs the site) must not leave that site's sender running here."""

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            site = LocalSite(
                broker, "a", tmp_path, upkeep_interval_s=3600.0, streams=local_streams(broker)
            )
            await site.open()
            assert site._state is not None
            saving = asyncio.Event()
            go_on = asyncio.Event()
            save = site._state.save

            async def slow_save(name: str, document: Any) -> None:
                saving.set()
                await go_on.wait()
                await save(name, document)

            site._state.save = slow_save  # type: ignore[method-assign]
            adding = asyncio.create_task(site.add_site("d", "127.0.0.1:3"))
            await saving.wait()
            closing = asyncio.create_task(site.close())
            await asyncio.sleep(0.05)
            go_on.set()
            await adding
            await closing
            senders = [t for t in asyncio.all_tasks() if t.get_name().startswith("sender ")]
            assert not senders and not site.senders
            assert [s.site_id for s in site.sites()] == ["d"], "saved: the next one starts it"

    asyncio.run(main())


def test_a_site_that_lost_its_leadership_stores_ships_releases_and_saves_nothing(
    tmp_path: Path,
) -> None:
    """A cluster's site is fenced by the leadership it was opened under: once lost (even if
    this broker leads the queue again, over a log another leader changed), its memory may stand
    on records that were cut, so it refuses transmits, reads for senders, registry and state
    saves, and its upkeep releases nothing, until the site loop closes it and opens anew."""

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            ours = [True]
            site = LocalSite(
                broker, "a", tmp_path, upkeep_interval_s=3600.0, streams=local_streams(broker)
            )
            site.fence(lambda: ours[0])
            await site.open({"b": "127.0.0.1:1"})
            await site.transmit("app", [Transmission(b"x", ["b"])])
            ours[0] = False
            with pytest.raises(SiteMoving):
                await site.transmit("app", [Transmission(b"y", ["b"])])
            with pytest.raises(SiteMoving):
                site.queue.read_for(site.registry.get("b").number, -1, 10)
            with pytest.raises(SiteMoving):
                await site.add_site("c", "127.0.0.1:2")
            assert [s.site_id for s in site.sites()] == ["b"]
            assert await site.upkeep.run_once() == []
            assert not await site.queue.save_index()
            await site.close()
            assert site.queue.next_offset == 1, "nothing stored after the fence"

    asyncio.run(main())


def test_closing_a_site_whose_open_failed_logs_no_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cluster's site whose open failed (a stream not settled yet) is closed and tried again
    at every pass: the close must not run a last upkeep pass over a queue never opened."""

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            own = local_streams(broker)

            async def unsettled(name: str, config: StreamConfig) -> Stream:
                if name == STATE_STREAM:
                    raise NotEnoughReplicas(f"{name} is not settled")
                return await own(name, config)

            site = LocalSite(broker, "a", tmp_path, upkeep_interval_s=3600.0, streams=unsettled)
            with pytest.raises(NotEnoughReplicas):
                await site.open()
            await site.close()

    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
