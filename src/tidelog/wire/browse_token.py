"""The continuation token of a browse: where each partition's read goes on, opaque to callers.

A merged page ends at one point of the merged order; because every partition's records are in
that order already (timestamps never decrease along offsets), the point is fully described by the
next offset each partition would read in the page's direction. The token holds exactly that — the
stream, the direction and per partition its next offset (None: that partition has nothing more in
this direction) — as compact JSON with a CRC, in URL-safe base64. Pure functions, no I/O.

Decoding checks everything a client could have damaged (base64, CRC, shape, version, stream,
direction, partitions) and raises :class:`~tidelog.errors.InvalidArgument` saying what to do.
A token carries no filter: the caller sends the same filter with it.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from tidelog.errors import InvalidArgument

VERSION: Final = 1
_OFFSET_LIMIT: Final = 2**63
_REDO: Final = "pass the next_token of a previous page unchanged, or browse again without a token"


@dataclass(frozen=True, slots=True)
class BrowsePosition:
    """Where a merged read goes on: per partition (ascending numbers) the next offset to read,
    the lowest (oldest first) or the highest (newest first); None when it has nothing more."""

    stream: str
    newest_first: bool
    offsets: tuple[tuple[int, int | None], ...]

    @property
    def finished(self) -> bool:
        """Nothing more in this direction in any partition."""
        return all(offset is None for _, offset in self.offsets)

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(number for number, _ in self.offsets)


def encode_token(position: BrowsePosition) -> str:
    body = json.dumps(
        {
            "v": VERSION,
            "s": position.stream,
            "n": position.newest_first,
            "p": [[number, offset] for number, offset in position.offsets],
        },
        separators=(",", ":"),
    ).encode()
    raw = zlib.crc32(body).to_bytes(4, "big") + body
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _invalid(why: str) -> InvalidArgument:
    return InvalidArgument(f"browse token {why}: {_REDO}")


def decode_token(token: str) -> BrowsePosition:
    """The position ``token`` stands for; ``InvalidArgument`` if it was not made by
    :func:`encode_token` (or was changed)."""
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise _invalid("is not valid base64") from None
    if len(raw) < 5 or zlib.crc32(raw[4:]).to_bytes(4, "big") != raw[:4]:
        raise _invalid("is damaged (its checksum does not match)")
    try:
        data: Any = json.loads(raw[4:])
    except (UnicodeDecodeError, ValueError):
        raise _invalid("is damaged") from None
    if not isinstance(data, dict) or data.get("v") != VERSION:
        raise _invalid("is of an unknown version")
    stream, newest_first, pairs = data.get("s"), data.get("n"), data.get("p")
    if not isinstance(stream, str) or not isinstance(newest_first, bool):
        raise _invalid("is damaged")
    if not isinstance(pairs, list) or not pairs:
        raise _invalid("names no partitions")
    offsets: list[tuple[int, int | None]] = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise _invalid("is damaged")
        number, offset = pair
        if not (_plain_int(number) and 0 <= number < _OFFSET_LIMIT):
            raise _invalid("is damaged")
        if offset is not None and not (_plain_int(offset) and 0 <= offset < _OFFSET_LIMIT):
            raise _invalid("is damaged")
        offsets.append((number, offset))
    numbers = [n for n, _ in offsets]
    if numbers != sorted(set(numbers)):
        raise _invalid("is damaged")
    return BrowsePosition(stream, newest_first, tuple(offsets))


def _plain_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_token(
    position: BrowsePosition,
    *,
    stream: str,
    newest_first: bool,
    partition_count: int,
    partitions: Sequence[int],
) -> None:
    """Raise ``InvalidArgument`` unless ``position`` continues a browse of this request."""
    if position.stream != stream:
        raise _invalid(f"belongs to stream {position.stream!r}, not {stream!r}")
    if position.newest_first != newest_first:
        made = "newest-first" if position.newest_first else "oldest-first"
        raise InvalidArgument(
            f"browse token continues {made} pages: ask for {made} pages with it, or browse the "
            f"other way again without a token"
        )
    if position.partitions[-1] >= partition_count:
        raise _invalid(f"names partition {position.partitions[-1]}, which the stream lacks")
    if partitions and tuple(sorted(set(partitions))) != position.partitions:
        raise _invalid(
            f"was made for partitions {list(position.partitions)}, not {sorted(set(partitions))}"
        )
