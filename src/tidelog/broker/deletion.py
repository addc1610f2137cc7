"""Deleting a stream, and the tombstones its files wait in until they are removed.

Invariants. A delete never touches the files of a later stream of the same name. The stream
leaves ``streams`` at once (on the loop); its name stays reserved in ``_deleting`` (creates wait
in :meth:`StreamDeletion.wait_deleted`, or get ``StreamDeleting``) until its directory has been
renamed to a tombstone under ``<data_dir>/deleted/`` and its logs are closed; only then is the
name free. Tombstones are removed in the background (``close`` waits for that). A crash at any
point leaves either the whole stream (the delete was not acknowledged) or a tombstone, which
start-up removes. A directory that cannot be moved aside is removed in place, metadata first, so
that whatever a crash leaves is never loaded as a stream again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import time
from pathlib import Path

from tidelog.broker.core import BrokerCore, check_not_internal
from tidelog.broker.stream import METADATA_FILE, Stream
from tidelog.durable import make_dirs

LOG = logging.getLogger("tidelog.broker")

TOMBSTONES = "deleted"
"""Directory under the data directory that holds deleted streams until their files are removed."""


def _remove_in_place(directory: Path) -> None:
    """Remove a stream directory where it is: its metadata first, so that whatever a crash
    leaves is never loaded as a stream again."""
    (directory / METADATA_FILE).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


class StreamDeletion(BrokerCore):
    """Stream deletion and its tombstones: one part of :class:`~tidelog.broker.broker.Broker`."""

    async def wait_deleted(self, name: str) -> None:
        """Return once no delete of a stream called ``name`` is in progress."""
        while (pending := self._deleting.get(name)) is not None:
            await asyncio.shield(pending)

    async def delete_stream(self, name: str) -> None:
        """Delete the stream: it is gone for readers and writers at once (on the loop); its
        directory becomes a tombstone and its logs are closed in a thread while the name stays
        reserved; the files are removed in the background."""
        stream = self.stream(name)
        check_not_internal(name, "delete")
        del self.streams[name]
        done = self.loop.create_future()
        self._deleting[name] = done
        try:
            for partition in stream.partitions:
                partition.deleted = True
                partition.signal.fire()
            try:
                await stream.views.close()
            except Exception:  # the views' files go with the stream's directory anyway
                LOG.exception("closing the views of deleted stream %s failed", name)
            tombstone = await asyncio.to_thread(self._discard, stream)
        finally:
            del self._deleting[name]
            done.set_result(None)
        if tombstone is not None:
            self._remove_later(tombstone)
        LOG.info("deleted stream %s", name)

    def _discard(self, stream: Stream) -> Path | None:
        """Rename the stream's directory to a tombstone, then close its logs without writing
        (a thread; the stream's name is reserved meanwhile). Renaming first means no log can
        create or write a file under the stream's name after this returns.

        Should the rename fail (an I/O error on the directory), the stream is removed in place
        instead, still under the reserved name: its metadata first, so that whatever a crash
        leaves is never loaded again. Returns the tombstone, or None when there is none."""
        try:
            tombstone = self._entomb(stream.directory)
        except OSError as error:
            LOG.warning(
                "could not move %s aside (%s); removing it in place", stream.directory, error
            )
            stream.discard()
            _remove_in_place(stream.directory)
            return None
        try:
            stream.discard()
        except Exception:  # the files go with the tombstone whatever happened to the logs
            LOG.exception("closing the logs of deleted stream %s failed", stream.name)
        return tombstone

    def _entomb(self, directory: Path) -> Path:
        """Move ``directory`` out of ``streams/`` (one rename), returning its new path. The
        rename is made durable when the directories can be synced; if they cannot, a crash may
        bring the stream back (the delete is then simply not done)."""
        tombstones = self.data_dir / TOMBSTONES
        make_dirs(tombstones)
        target = tombstones / f"{time.time_ns()}-{secrets.token_hex(4)}-{directory.name[:64]}"
        os.rename(directory, target)
        for parent in (directory.parent, tombstones):
            try:
                fd = os.open(parent, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as error:
                LOG.warning("could not sync %s after moving %s: %s", parent, directory, error)
        return target

    def _remove_dir(self, directory: Path) -> None:
        """Take a stream directory out of ``streams/`` now and remove its files later; when it
        cannot be moved (an I/O error), remove it in place, metadata first."""
        try:
            self._remove_later(self._entomb(directory))
        except OSError as error:
            LOG.warning("could not move %s aside (%s); removing it in place", directory, error)
            _remove_in_place(directory)

    def _remove_later(self, tombstone: Path) -> None:
        """Remove a tombstone's files in a thread; close() waits for it."""
        task = self.loop.create_task(asyncio.to_thread(shutil.rmtree, tombstone, True))
        self._cleanup.add(task)
        task.add_done_callback(self._cleanup.discard)

    def _remove_tombstones(self) -> None:
        """At start: remove the tombstones a crash left behind (they are never loaded)."""
        tombstones = self.data_dir / TOMBSTONES
        if tombstones.exists():
            for leftover in sorted(tombstones.iterdir()):
                self._remove_later(leftover)
