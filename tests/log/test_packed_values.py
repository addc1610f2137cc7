"""Values appended as one buffer plus sizes encode exactly like the same values as a list."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.log.record import PackedValues, encode_batch


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.binary(max_size=40), min_size=1, max_size=40))
def test_packed_values_encode_like_a_list(values: list[bytes]) -> None:
    offsets = np.arange(5, 5 + len(values), dtype=np.int64)
    sizes = np.array([len(v) for v in values], dtype=np.int64)
    packed = PackedValues(b"".join(values), sizes)
    assert list(packed) == values
    assert packed[-1] == values[-1]
    assert packed[1:3] == values[1:3]
    as_list = encode_batch(values, offsets, 77, 1 << 20)
    as_buffer = encode_batch(packed, offsets, 77, 1 << 20)
    assert as_buffer.data.tobytes() == as_list.data.tobytes()


def test_sizes_that_do_not_fit_the_buffer_are_refused() -> None:
    with pytest.raises(ValueError, match="add up to 3"):
        PackedValues(b"ab", np.array([1, 2], dtype=np.int64))
