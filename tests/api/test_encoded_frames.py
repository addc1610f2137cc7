"""SubscribeBatches' frames laid out by hand are the bytes protobuf writes for the same frame."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tidelog.api.decoding import passing_bytes
from tidelog.api.framed import PREFIX
from tidelog.api.frames import (
    encoded_record_batch,
    encoded_record_batch_pieces,
    framed_record_batch,
    record_batch,
)
from tidelog.log import NewRecord, open_log


@pytest.mark.parametrize(
    "shape",
    ["plain", "keys", "headers", "empty values", "large"],
)
def test_encoded_frame_is_what_protobuf_serialises(tmp_path: Path, shape: str) -> None:
    rng = np.random.default_rng(7)
    n = 3000 if shape == "large" else 40
    sizes = rng.integers(1, 300, n)
    values = [b"" if shape == "empty values" else rng.bytes(int(s)) for s in sizes]
    keys = [None if i % 3 else f"k{i}".encode() for i in range(n)] if shape == "keys" else None
    records = [
        NewRecord(
            value,
            key=None if keys is None else keys[i],
            headers={"h": bytes([i % 256])} if shape == "headers" and i % 2 else {},
        )
        for i, value in enumerate(values)
    ]
    log = open_log(tmp_path / "log")
    try:
        log.append(records)
        reader = log.forward_reader(0)
        read = 0
        while batch := reader.read(700, 64 << 10):
            encoded = encoded_record_batch(batch)
            assert encoded == record_batch(batch).SerializeToString()
            untimed = encoded_record_batch(batch, timestamps=False)
            assert untimed == record_batch(batch, timestamps=False).SerializeToString()
            assert b"".join(framed_record_batch(batch, timestamps=False).data)[5:] == untimed
            pieces = encoded_record_batch_pieces(batch)
            assert any(piece is batch.data for piece in pieces)  # the records, not copied
            assert b"".join(pieces) == encoded
            framed = framed_record_batch(batch)
            assert framed.count == 1 and isinstance(framed.data, tuple)
            assert b"".join(framed.data) == PREFIX.pack(0, len(encoded)) + encoded
            read += len(batch)
        assert read == n
    finally:
        log.close()


def test_serialised_responses_pass_through() -> None:
    seen: list[object] = []

    def serialize(message: object) -> bytes:
        seen.append(message)
        return b"serialised"

    send = passing_bytes(serialize)
    frame = b"\x0a\x00"
    assert send(frame) is frame
    assert send(bytearray(b"x")) == b"serialised"  # only bytes pass: anything else is a message
    assert seen == [bytearray(b"x")]
