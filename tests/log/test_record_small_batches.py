"""Small batches are packed record by record; the bytes must equal the vectorised layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.log import record
from tidelog.log.record import NewRecord, encode_batch

messages = st.lists(
    st.one_of(
        st.binary(max_size=64),
        st.builds(
            NewRecord,
            st.binary(max_size=64),
            key=st.one_of(st.none(), st.binary(max_size=8)),
            headers=st.dictionaries(st.text(max_size=4), st.binary(max_size=4), max_size=3),
        ),
    ),
    min_size=1,
    max_size=record._SMALL_BATCH,
)


@settings(max_examples=200, deadline=None)
@given(batch=messages, first=st.integers(0, 2**40), timestamp=st.integers(0, 2**62))
def test_small_batch_bytes_equal_the_vectorised_layout(
    batch: list[bytes | NewRecord], first: int, timestamp: int
) -> None:
    offsets = np.arange(first, first + len(batch), dtype=np.int64)
    small = encode_batch(batch, offsets, timestamp, 1 << 20)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(record, "_SMALL_BATCH", 0)
        vectorised = encode_batch(batch, offsets, timestamp, 1 << 20)
    assert small.data.tobytes() == vectorised.data.tobytes()
    assert small.sizes.tolist() == vectorised.sizes.tolist()
