"""``wire.arrow.gather`` hands pyarrow contiguous bytes whatever the records' spacing."""

from __future__ import annotations

import numpy as np

from tidelog.wire.arrow import gather


def test_evenly_spaced_one_byte_values_come_back_contiguous() -> None:
    buffer = np.frombuffer(b"a-b-c-d-", dtype=np.uint8)
    starts = np.array([0, 2, 4, 6], dtype=np.int64)
    sizes = np.ones(4, dtype=np.int64)
    out = gather(buffer, starts, sizes)
    assert out.flags.c_contiguous
    assert out.tobytes() == b"abcd"
