"""``MessageBatch.first_header`` against each record's decoded headers, for names whose header
prefix is shorter than, exactly, or not a multiple of the eight-byte words it compares, for
batches where every record, some or none have the header, and for records of one size (read in
place, evenly spaced) or of many."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.log import MessageBatch, NewRecord
from tidelog.log.record import encode_batch, gather_headers

LIMIT = 1 << 20


def message_batch(records: list[NewRecord]) -> MessageBatch:
    batch = encode_batch(records, np.arange(len(records), dtype=np.int64), 5, LIMIT)
    data = batch.data.tobytes()
    positions = np.cumsum(batch.sizes) - batch.sizes
    return MessageBatch(data, positions, batch.sizes, gather_headers(data, positions))


@st.composite
def batches(draw: st.DrawFn) -> tuple[str, int, list[NewRecord]]:
    # Prefix = 2 + len(name) + 4 bytes: names of 1, 2, 3 and 10 characters give 7, 8, 9, 16.
    name = draw(st.sampled_from(["k", "kf", "__k", "__kafka", "0123456789", "é"]))
    width = draw(st.sampled_from([0, 1, 8, 10]))
    every = draw(st.booleans())
    # Records of one size (stored evenly spaced: the strided reads) or of any sizes (gathers).
    uniform = draw(st.booleans())
    size = draw(st.integers(0, 20))
    kinds = ["first", "other"] if uniform else ["first", "none", "other", "width"]
    records = []
    for _ in range(draw(st.integers(1, 60))):
        value = draw(st.binary(min_size=size, max_size=size) if uniform else st.binary(max_size=20))
        key = None if uniform else draw(st.none() | st.binary(max_size=5))
        kind = "first" if every else draw(st.sampled_from(kinds))
        if kind == "first":
            headers = {name: draw(st.binary(min_size=width, max_size=width))}
            if not uniform and draw(st.booleans()):
                headers["more"] = b"x"
        elif kind == "other":  # the same prefix length, another name
            headers = {name[:-1] + chr(ord(name[-1]) ^ 1): b"\0" * width}
        elif kind == "width":
            headers = {name: b"\0" * (width + 1)}
        else:
            headers = {}
        records.append(NewRecord(value, key=key, headers=headers))
    return name, width, records


@settings(max_examples=300, deadline=None)
@given(batches())
def test_first_header_agrees_with_the_decoded_headers(
    batch: tuple[str, int, list[NewRecord]],
) -> None:
    name, width, records = batch
    read = message_batch(records)
    mask, values = read.first_header(name, width)
    assert values.shape == (len(records), width)
    for i, decoded in enumerate(read.headers()):
        items = list(decoded.items())
        has = bool(items) and items[0][0] == name and len(items[0][1]) == width
        assert bool(mask[i]) == has
        assert bytes(values[i]) == (items[0][1] if has else bytes(width))
