"""The delta queue's tag index across restarts: restored from its snapshot, or rebuilt.

At open (``SendQueue.open``) the index is restored from its snapshot file (``tag_index_file.py``,
:func:`restored`) and only the records after the offset it covers are read; without a usable
snapshot (missing, damaged, or not fitting the queue: covering records the queue does not hold,
or missing records retention has since removed) it is rebuilt by reading the whole queue
(:func:`rebuilt`), taking the trim marks a cluster's queue keeps in its site state instead of a
file (:func:`trim_marks`) when they knew the queue to its front at least.

Invariants: a record's bit for a site counts only from that site's ``since`` offset on
(:func:`index_record`), and a snapshot's list or trim mark for a number whose site changed since
(removed, or the number taken by another) is dropped, so a removed site's entries never reach a
later site that took its number. No I/O but reading the snapshot file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tidelog.sites.registry import Site
from tidelog.sites.tag_index import TagIndex
from tidelog.sites.tag_index_file import decode as decode_index

LOG = logging.getLogger("tidelog.sites")


def restored(path: Path | None, sites: list[Site], oldest: int, newest: int) -> TagIndex | None:
    """The index from its snapshot file, fitted to the registry; None when there is no
    usable one (then the caller reads the whole queue)."""
    if path is None or not path.exists():
        return None
    try:
        index, since = decode_index(path.read_bytes())
    except (OSError, ValueError) as error:
        LOG.warning("%s is unusable (%s): rebuilding the tag index from the queue", path, error)
        return None
    if index.covers > newest or index.covers + 1 < oldest:
        LOG.warning(
            "%s covers the queue up to offset %d, but the queue holds offsets %d to %d: "
            "rebuilding the tag index from the queue",
            path,
            index.covers,
            oldest,
            newest,
        )
        return None
    declared = {site.number: site.since for site in sites}
    for number, site_since in since.items():
        if declared.get(number) != site_since:  # removed, or the number taken since
            index.forget_site(number)
    return index


def rebuilt(oldest: int, marks: Any | None, sites: list[Site]) -> TagIndex:
    """An empty index from the queue's front ``oldest``, to be filled by reading the queue.

    Which sites the records below the front were for is not known: for every site, held_from
    starts there, unless ``marks`` (the trim marks saved in a cluster's site state, whose queue
    has no snapshot file) knew the queue to this front at least: a gap trimmed since they were
    saved is unknown, and every site is then held from the front."""
    index = TagIndex()
    index.oldest = index.base = oldest
    if not marks or int(marks["oldest"]) < oldest:
        return index
    declared = {site.number: site.since for site in sites}
    since = {int(n): int(s) for n, s in marks["since"].items()}
    lost = {
        int(n): int(o)
        for n, o in marks["lost"].items()
        if int(n) in declared and declared[int(n)] == since.get(int(n))
    }
    index.assume_trims(int(marks["base"]), lost)
    return index


def index_record(index: TagIndex, offset: int, counts: dict[int, int], sites: list[Site]) -> None:
    """Add the record at ``offset`` (its entries per site number) for the sites it counts for."""
    live = {
        site.number: counts[site.number]
        for site in sites
        if site.number in counts and site.since <= offset
    }
    if live:
        index.add(offset, live)


def trim_marks(
    index: TagIndex, base: int, lost: dict[int, int], sites: list[Site]
) -> dict[str, Any]:
    """The document :func:`rebuilt` takes back: the index's trim marks (``index.trims()``)
    with each site's ``since``, so that marks of a site changed since are dropped."""
    return {
        "oldest": index.oldest,
        "base": base,
        "lost": {str(n): o for n, o in lost.items()},
        "since": {str(site.number): site.since for site in sites},
    }
