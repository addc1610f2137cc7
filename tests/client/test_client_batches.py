"""``ReceivedBatch`` (``tidelog.client.batches``): a frame's columns as views, messages on demand.

Without a server: frames are packed as the server packs them (values back to back, or pointed at
inside stored records), and every view must agree with the per-message decoding the client has
always done; the views must be views (no copy of the frame's columns); and neither numpy nor
pyarrow may be loaded by a client that only iterates messages.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client import ReceivedBatch, ReceivedMessage
from tidelog.client.codec import browse_page, decode
from tidelog.errors import MissingExtra
from tidelog.wire import columns
from tidelog.wire.arrow import MalformedBatch


def frame(offsets: list[int], stamps: list[int], messages: v1.Messages) -> v1.RecordBatch:
    return v1.RecordBatch(
        offsets=columns.pack_int64(np.array(offsets, dtype=np.int64)),
        timestamps=columns.pack_int64(np.array(stamps, dtype=np.int64)),
        messages=messages,
    )


def stored(values: list[bytes], gap: int) -> v1.Messages:
    """Values inside filler, pointed at (``value_positions``), as the server sends records."""
    blob, starts = b"", []
    for value in values:
        blob += b"#" * gap
        starts.append(len(blob))
        blob += value
    return columns.pack_at(
        blob, np.array(starts, dtype=np.int64), np.array([len(v) for v in values], np.int64)
    )


MESSAGES = st.lists(
    st.tuples(
        st.binary(max_size=30),
        st.none() | st.binary(max_size=8),
        st.dictionaries(st.text(max_size=4), st.binary(max_size=4), max_size=2),
    ),
    max_size=25,
)


@settings(deadline=None)  # the first example loads pyarrow
@given(MESSAGES, st.booleans())
def test_columns_agree_with_the_decoded_messages(
    messages: list[tuple[bytes, bytes | None, dict[str, bytes]]], pointed: bool
) -> None:
    values = [v for v, _, _ in messages]
    keys = [k for _, k, _ in messages]
    headers = [h for _, _, h in messages]
    packed = stored(values, 3) if pointed else columns.pack(values, keys, headers)
    if pointed:  # pack_at carries values only here; keys and headers as pack does
        extra = columns.pack(values, keys, headers)
        packed.keys, packed.key_sizes = extra.keys, extra.key_sizes
        packed.headers.extend(extra.headers)
    n = len(values)
    raw = frame(list(range(10, 10 + n)), [1000 * i for i in range(n)], packed)
    batch = ReceivedBatch(raw, "s", 4)
    decoded = decode(raw, "s", 4)
    assert len(batch) == n
    assert list(batch) == decoded  # old per-message access: iterate the batch
    assert batch.offsets.tolist() == [m.offset for m in decoded]
    assert batch.timestamps.tolist() == [m.timestamp for m in decoded]
    assert batch.partitions.tolist() == [4] * n
    assert batch.values.to_list() == values == [batch.values[i] for i in range(n)]
    has_keys = any(k is not None for k in keys)
    assert (batch.keys.to_list() if batch.keys is not None else None) == (
        keys if has_keys else None
    )
    assert [dict(h) for h in batch.headers] == [dict(m.headers) for m in decoded]
    arrow = batch.to_arrow()
    assert arrow.column("value").to_pylist() == values
    assert arrow.column("offset").to_pylist() == batch.offsets.tolist()


def test_views_share_the_frames_bytes() -> None:
    batch = ReceivedBatch(frame([1, 2], [5, 6], stored([b"ab", b"cd"], 2)), "s", 0)
    for view in (batch.offsets, batch.timestamps, batch.values.buffer, batch.values.sizes):
        assert not view.flags.owndata and not view.flags.writeable  # a view of bytes
    assert batch.values.starts.tolist() == [2, 6]
    assert batch.values.buffer[2:4].tobytes() == b"ab"
    assert batch.first_offset == 1 and batch.last_offset == 2


def test_messages_are_built_once_and_only_when_asked() -> None:
    batch = ReceivedBatch(frame([0, 1], [0, 0], columns.pack([b"x", b"y"])), "s", 0)
    assert batch._messages is None  # columns and len need no message
    assert len(batch) == 2 and batch.values.to_list() == [b"x", b"y"]
    assert batch._messages is None
    first = batch[0]
    assert isinstance(first, ReceivedMessage) and first.value == b"x"
    assert batch.messages() is batch.messages()


def test_one_header_as_a_column() -> None:
    packed = columns.pack([b"a", b"b", b"c"], None, [{"p": b"1", "q": b"x"}, {}, {"p": b"3"}])
    batch = ReceivedBatch(frame([0, 1, 2], [0, 0, 0], packed), "s", 0)
    assert batch.header("p") == [b"1", None, b"3"]
    assert batch.header("absent") == [None, None, None]
    plain = ReceivedBatch(frame([0], [0], columns.pack([b"a"])), "s", 0)
    assert plain.header("p") == [None] and not plain.has_headers


def test_a_narrowed_arrow_batch() -> None:
    batch = ReceivedBatch(frame([7, 8], [1, 2], stored([b"v1", b"v2"], 5)), "t", 1)
    got = batch.to_arrow(("partition", "value"))
    assert isinstance(got, pa.RecordBatch)
    assert got.to_pydict() == {"partition": [1, 1], "value": [b"v1", b"v2"]}


def test_a_browse_page_is_a_batch_with_each_messages_partition() -> None:
    response = v1.BrowseResponse(
        batch=frame([3, 9], [10, 20], columns.pack([b"a", b"b"], None, [{"h": b"1"}, {}])),
        partitions=np.array([2, 0], dtype="<i4").tobytes(),
    )
    page = browse_page(response, "s")
    assert page.batch is page.messages
    assert [(m.partition, m.offset, m.value) for m in page.messages] == [(2, 3, b"a"), (0, 9, b"b")]
    assert page.batch is not None and page.batch.partitions.tolist() == [2, 0]
    assert page.messages[0].merge_key == (10, 2, 3)
    assert page.batch.to_arrow(("partition",)).column(0).to_pylist() == [2, 0]


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: setattr(f, "timestamps", f.timestamps[:8]),
        lambda f: setattr(f.messages, "value_sizes", f.messages.value_sizes[:4]),
        lambda f: setattr(f.messages, "values", f.messages.values + b"!"),
        lambda f: setattr(f.messages, "key_sizes", np.array([5, -1], "<i4").tobytes()),
    ],
)
def test_columns_that_do_not_fit_are_refused(damage: object) -> None:
    broken = frame([0, 1], [0, 0], columns.pack([b"a", b"b"], [b"k", None]))
    damage(broken)  # type: ignore[operator]
    with pytest.raises(MalformedBatch):
        batch = ReceivedBatch(broken, "s", 0)
        batch.values  # noqa: B018
        batch.keys  # noqa: B018


def test_without_pyarrow_to_arrow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = ReceivedBatch(frame([0], [0], columns.pack([b"a"])), "s", 0)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow fails as if missing
    with pytest.raises(MissingExtra, match=r"tidelog\[spark\]"):
        batch.to_arrow()
    assert [m.value for m in batch] == [b"a"]  # messages need no pyarrow


PROBE = """
import json, struct, sys
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client import ReceivedBatch
raw = v1.RecordBatch(
    offsets=struct.pack("<q", 5), timestamps=struct.pack("<q", 6),
    messages=v1.Messages(values=b"v", value_sizes=struct.pack("<I", 1)),
)
got = [(m.offset, m.value.decode()) for m in ReceivedBatch(raw, "s", 0)]
heavy = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("numpy", "pyarrow")})
print(json.dumps({"got": got, "heavy": heavy}))
"""


def test_iterating_messages_loads_neither_numpy_nor_pyarrow() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == {"got": [[5, "v"]], "heavy": []}
