"""Compaction: rewrite sealed segments keeping only the latest record per key.

What stays: every record without a key, the newest record of each key (newest across the whole
committed log, active segment included), and everything at or above the high watermark the pass
started from. Kept records are copied byte for byte (offsets, timestamps and CRCs unchanged), so
compaction only ever turns records into offset gaps, which every reader handles.

Crash safety (the swap protocol). For each segment rewritten:

1. write ``<base>.log.cleaned`` and ``<base>.index.cleaned`` and sync them;
2. rename the log to ``<base>.log.swap``, then the index to ``<base>.index.swap`` — the second
   rename is the commit point;
3. rename ``.log.swap`` over ``<base>.log``, then ``.index.swap`` over ``<base>.index``.

Recovery (:func:`finish_swaps`, run before anything else on open) completes a committed swap
(``.index.swap`` exists) and discards an uncommitted one (``.cleaned`` files, or a ``.log.swap``
without its ``.index.swap``). A crash therefore leaves either the old segment or the new one,
never neither, and never a mix.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidelog import durable
from tidelog.log.batch import MessageBatch
from tidelog.log.index import INDEX_DTYPE, IndexArray

CLEANED = ".cleaned"
SWAP = ".swap"

Step = Callable[[str], None]
"""Called with the name of each step of a swap (for fault-injection tests)."""


@dataclass(slots=True)
class CompactionReport:
    segments_rewritten: int = 0
    records_removed: int = 0
    bytes_removed: int = 0


def latest_offsets(batches: Iterable[MessageBatch]) -> dict[bytes, int]:
    """The newest offset of every key in ``batches`` (forward order)."""
    latest: dict[bytes, int] = {}
    for batch in batches:
        for offset, key in zip(batch.offsets.tolist(), batch.keys(), strict=True):
            if key is not None:
                latest[key] = offset
    return latest


def keep_mask(
    offsets: list[int], keys: list[bytes | None], latest: dict[bytes, int], high_watermark: int
) -> np.ndarray:
    """Which records of a segment compaction keeps."""
    return np.fromiter(
        (
            key is None or offset >= high_watermark or latest.get(key, offset) == offset
            for offset, key in zip(offsets, keys, strict=True)
        ),
        dtype=bool,
        count=len(offsets),
    )


def write_cleaned(
    directory: Path, name: str, data: bytes, entries: IndexArray, keep: np.ndarray
) -> tuple[Path, Path, IndexArray, int]:
    """Write the kept records of one segment (its whole ``data``) as ``.cleaned`` files.

    Returns the two paths, the new index entries and the new file size.
    """
    kept = entries[keep]
    sizes = kept["size"].astype(np.int64)
    starts = kept["position"].astype(np.int64)
    new_entries = np.empty(len(kept), dtype=INDEX_DTYPE)
    new_entries["rel"] = kept["rel"]
    new_entries["timestamp"] = kept["timestamp"]
    new_entries["size"] = kept["size"]
    ends = np.cumsum(sizes)
    new_entries["position"] = ends - sizes
    log_path = directory / f"{name}.log{CLEANED}"
    index_path = directory / f"{name}.index{CLEANED}"
    view = memoryview(data)
    ends_at = (starts + sizes).tolist()
    kept_bytes = b"".join(view[a:b] for a, b in zip(starts.tolist(), ends_at, strict=True))
    try:
        durable.write_new_file(log_path, kept_bytes, sync=True)
        durable.write_new_file(index_path, new_entries.tobytes(), sync=True)
    except BaseException:  # a full disk: the segment stays as it was, no half-written copy
        log_path.unlink(missing_ok=True)
        index_path.unlink(missing_ok=True)
        raise
    return log_path, index_path, new_entries, int(ends[-1]) if len(ends) else 0


def swap_in(directory: Path, name: str, step: Step | None = None) -> None:
    """Steps 2 and 3 of the swap protocol for the ``.cleaned`` files of segment ``name``."""
    log, index = directory / f"{name}.log", directory / f"{name}.index"

    def at(label: str) -> None:
        if step is not None:
            step(label)

    os.replace(directory / f"{name}.log{CLEANED}", directory / f"{name}.log{SWAP}")
    at("log renamed to .swap")
    os.replace(directory / f"{name}.index{CLEANED}", directory / f"{name}.index{SWAP}")
    sync_dir(directory)
    at("committed")
    os.replace(directory / f"{name}.log{SWAP}", log)
    at("log swapped")
    os.replace(directory / f"{name}.index{SWAP}", index)
    sync_dir(directory)


def finish_swaps(directory: Path) -> list[str]:
    """Complete committed swaps, discard uncommitted ones; returns what was done, for logging."""
    done: list[str] = []
    for path in sorted(directory.glob(f"*{CLEANED}")):
        path.unlink()
        done.append(f"discarded {path.name}")
    for index_swap in sorted(directory.glob(f"*.index{SWAP}")):
        name = index_swap.name.removesuffix(f".index{SWAP}")
        log_swap = directory / f"{name}.log{SWAP}"
        if log_swap.exists():
            os.replace(log_swap, directory / f"{name}.log")
        os.replace(index_swap, directory / f"{name}.index")
        done.append(f"completed the compaction of {name}")
    for log_swap in sorted(directory.glob(f"*.log{SWAP}")):
        log_swap.unlink()  # its index never reached .swap: the swap was not committed
        done.append(f"discarded {log_swap.name}")
    if done:
        sync_dir(directory)
    return done


def sync_dir(directory: Path) -> None:
    """fsync a directory, so that file creations, renames and removals in it are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
