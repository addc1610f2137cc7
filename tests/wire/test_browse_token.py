"""The browse token (``tidelog.wire.browse_token``): it round-trips, refuses what a client could
have damaged, and continues only a browse of the request that made it."""

from __future__ import annotations

import pytest

from tidelog.errors import InvalidArgument
from tidelog.wire.browse_token import BrowsePosition, check_token, decode_token, encode_token


def test_tokens_round_trip_and_refuse_damage() -> None:
    position = BrowsePosition("s", True, ((0, 5), (2, None)))
    token = encode_token(position)
    assert decode_token(token) == position
    flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    too_far = encode_token(BrowsePosition("s", True, ((0, 2**63),)))  # a well-formed lie
    unsorted = encode_token(BrowsePosition("s", True, ((2, 1), (0, 1))))
    for bad in ("", "!!", "é", flipped, token[:10], too_far, unsorted):
        with pytest.raises(InvalidArgument, match="next_token of a previous page"):
            decode_token(bad)


def test_a_position_knows_when_it_is_finished() -> None:
    assert BrowsePosition("s", False, ((0, None), (1, None))).finished
    assert not BrowsePosition("s", False, ((0, None), (1, 0))).finished


POSITION = BrowsePosition("s", True, ((0, 5), (2, None)))


@pytest.mark.parametrize(
    ("stream", "newest_first", "partition_count", "partitions", "refusal"),
    [
        ("s", True, 3, [], None),
        ("s", True, 3, [2, 0, 2], None),  # the same partitions, in any order
        ("t", True, 3, [], "belongs to stream 's'"),
        ("s", False, 3, [], "continues newest-first pages"),
        ("s", True, 2, [], "names partition 2"),
        ("s", True, 3, [0, 1], r"made for partitions \[0, 2\]"),
    ],
)
def test_a_token_continues_only_the_browse_that_made_it(
    stream: str,
    newest_first: bool,
    partition_count: int,
    partitions: list[int],
    refusal: str | None,
) -> None:
    def check() -> None:
        check_token(
            POSITION,
            stream=stream,
            newest_first=newest_first,
            partition_count=partition_count,
            partitions=partitions,
        )

    if refusal is None:
        check()
    else:
        with pytest.raises(InvalidArgument, match=refusal):
            check()
