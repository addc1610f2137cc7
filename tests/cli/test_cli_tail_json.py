"""``tidelog tail --json`` prints a page from its columns (``batch_json``): the very lines the
per-message form (``message_json``) prints, receive-queue number headers included."""

from __future__ import annotations

import numpy as np
import pytest

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.cli.tail_command import batch_json, message_json
from tidelog.client import ReceivedBatch
from tidelog.wire import POSITION_HEADER, RECEIVE_QUEUE_PREFIX, columns


def page(stream: str) -> ReceivedBatch:
    messages = columns.pack(
        [b"plain", b"\xff\xfe", b""],
        [b"k", None, b"\x00\x01"],
        [{POSITION_HEADER: (7).to_bytes(8, "big"), "x": b"y"}, {}, {"x": b"\x80"}],
    )
    frame = v1.RecordBatch(
        offsets=np.array([4, 9, 5], "<i8").tobytes(),
        timestamps=np.array([100, 200, 300], "<i8").tobytes(),
        messages=messages,
    )
    return ReceivedBatch(frame, stream, 2, partitions=np.array([2, 0, 1], "<i4").tobytes())


@pytest.mark.parametrize("stream", ["orders", f"{RECEIVE_QUEUE_PREFIX}app.site-b"])
def test_lines_from_columns_are_the_per_message_lines(stream: str) -> None:
    batch = page(stream)
    assert batch_json(batch) == [message_json(m) for m in batch]
    assert batch_json(batch, 2) == [message_json(m) for m in batch][:2]
    assert batch_json(batch, 0) == []
