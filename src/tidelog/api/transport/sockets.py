"""Writing a list of byte pieces to a non-blocking socket with ``writev``, as far as it takes.

The connection's flush (``connection.py``) builds its DATA frames as pieces beside the
responses' own objects; :func:`writev` hands them to the kernel in as few calls as the
platform's iovec limit allows, and returns what is left for asyncio's transport.

Invariant: the pieces returned, written in order after what was written, are the input's
bytes exactly (the first one cut where the socket stopped).
"""

from __future__ import annotations

import os
from typing import Final

from tidelog.api.framed import Piece

_IOV_MAX: Final = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 16


def writev(fd: int, pieces: list[Piece]) -> list[Piece]:
    """Write ``pieces`` to the non-blocking socket ``fd`` in as few ``writev`` calls as it
    takes; what it would not take now (or all that follows an error, for the transport to
    report) is returned, the first piece cut where the socket stopped."""
    start = 0
    while start < len(pieces):
        batch = pieces[start : start + _IOV_MAX]
        try:
            written = os.writev(fd, batch)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:
            break
        for piece in batch:
            length = len(piece)
            if written < length:
                if written:
                    pieces[start] = memoryview(piece)[written:]
                return pieces[start:]
            written -= length
            start += 1
    return pieces[start:]
