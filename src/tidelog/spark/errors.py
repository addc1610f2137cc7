"""The failures of the Spark data source, one type each.

Spark wraps whatever a data source raises (``PythonException`` / ``AnalysisException``), so the
type is for tests and Python callers; the message is what a Spark user sees, and it names the
option to change.
"""

from __future__ import annotations

from tidelog.errors import TidelogError


class SparkSourceError(TidelogError):
    """Base class of the data source's own errors."""


class InvalidOption(SparkSourceError, ValueError):
    """An option is missing, malformed, or contradicts another (ending before starting)."""


class UnknownStream(SparkSourceError):
    """The ``stream`` option names no stream on the broker."""


class UnknownPartition(SparkSourceError):
    """An option names a partition the stream does not have."""


class OffsetsLost(SparkSourceError):
    """Retention removed offsets the query still needed, and ``failOnDataLoss`` is true."""
