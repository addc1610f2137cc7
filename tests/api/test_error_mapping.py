"""``tidelog.api.status`` without a server: raw OSErrors for a full disk or the descriptor limit
map to RESOURCE_EXHAUSTED, details are capped, and the warning throttle counts what it holds."""

from __future__ import annotations

import errno
import logging

import grpc
import pytest

from tidelog.api.status import DETAIL_BYTES, Throttle, cap_detail, log_failure, status_of
from tidelog.errors import StreamNotFound, echo


@pytest.mark.parametrize(
    ("number", "resource"),
    [
        (errno.ENOSPC, "disk space"),
        (errno.EDQUOT, "disk space"),
        (errno.EMFILE, "file descriptors"),
        (errno.ENFILE, "file descriptors"),
    ],
)
def test_resource_oserrors_are_resource_exhausted(number: int, resource: str) -> None:
    error = OSError(number, "ran out", "/data/streams/s/stream.json")
    code, detail = status_of(error)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"out of {resource} at /data/streams/s/stream.json" in detail


def test_a_resource_oserror_without_a_file_name_says_where_it_can() -> None:
    assert "at the data directory" in status_of(OSError(errno.ENOSPC, "full"))[1]
    assert "at this process" in status_of(OSError(errno.EMFILE, "too many"))[1]


def test_other_oserrors_stay_internal() -> None:
    code, detail = status_of(OSError(errno.EIO, "I/O error", "/x"))
    assert code == grpc.StatusCode.INTERNAL
    assert detail == "internal error (OSError); see the server log"


def test_a_resource_error_is_one_warning_line_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="tidelog.api"):
        log_failure(OSError(errno.ENOSPC, "full", "/data/unique-for-this-test"))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "out of disk space at /data/unique-for-this-test" in record.getMessage()


def test_details_are_capped() -> None:
    code, detail = status_of(StreamNotFound("x" * 100))
    assert code == grpc.StatusCode.NOT_FOUND and "x" * 100 in detail
    capped = cap_detail("é" * 5000)
    assert len(capped.encode()) <= DETAIL_BYTES + 20
    assert capped.endswith("…(10000 bytes)")


def test_echo_shortens_long_input() -> None:
    assert echo("short") == "'short'"
    assert echo("n" * 1000) == repr("n" * 200) + "…(1000 bytes)"
    assert echo(b"\xff" * 300).endswith("…(300 bytes)")


def test_throttle_allows_one_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    throttle = Throttle(10.0, clock=lambda: now[0])
    assert throttle.allow("a") == 0
    assert throttle.allow("a") is None
    assert throttle.allow("b") == 0  # keys are independent
    now[0] = 9.9
    assert throttle.allow("a") is None
    now[0] = 10.0
    assert throttle.allow("a") == 2
    assert throttle.allow("a") is None
