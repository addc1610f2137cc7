"""Indexing one message of a ``ReceivedBatch`` builds that message alone, and it is the very
message that building them all gives, for subscription frames and browse pages, with keys,
headers and values pointed at or back to back; indexes out of range raise ``IndexError``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client import ReceivedBatch
from tidelog.wire import columns
from tidelog.wire.received import ReceivedFrame

MESSAGES = st.lists(
    st.tuples(
        st.binary(max_size=20),
        st.none() | st.binary(max_size=6),
        st.dictionaries(st.text(max_size=3), st.binary(max_size=3), max_size=2),
    ),
    min_size=1,
    max_size=15,
)


def batch_of(
    messages: list[tuple[bytes, bytes | None, dict[str, bytes]]], page: bool, received: bool
) -> ReceivedBatch:
    values = [v for v, _, _ in messages]
    n = len(values)
    frame = v1.RecordBatch(
        offsets=columns.pack_int64(np.arange(3, 3 + n, dtype=np.int64)),
        timestamps=columns.pack_int64(np.arange(n, dtype=np.int64) * 7),
        messages=columns.pack(values, [k for _, k, _ in messages], [h for _, _, h in messages]),
    )
    got = ReceivedFrame(frame.SerializeToString()) if received else frame
    partitions = np.arange(n, dtype="<i4").tobytes() if page else None
    return ReceivedBatch(got, "s", 1, partitions=partitions)


@settings(deadline=None)
@given(MESSAGES, st.booleans(), st.booleans(), st.data())
def test_one_message_is_the_one_all_give(
    messages: list[tuple[bytes, bytes | None, dict[str, bytes]]],
    page: bool,
    received: bool,
    data: st.DataObject,
) -> None:
    n = len(messages)
    index = data.draw(st.integers(-n, n - 1))
    alone = batch_of(messages, page, received)
    one = alone[index]
    assert alone._messages is None  # the others were not built
    everything = batch_of(messages, page, received).messages()
    assert one == everything[index]
    assert type(one.headers) is type(everything[index].headers)


def test_an_index_out_of_range() -> None:
    batch = batch_of([(b"a", None, {})], page=False, received=True)
    for index in (1, -2):
        with pytest.raises(IndexError):
            batch[index]
