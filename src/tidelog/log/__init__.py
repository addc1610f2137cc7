"""The commit log: segmented, indexed, crash-safe, readable forward and backward.

Entry points: :class:`SegmentedLog` (or :func:`open_log`) with a :class:`LogConfig`; readers from
``log.forward_reader(...)`` / ``log.reverse_reader(...)`` return :class:`MessageBatch` objects.
"""

from tidelog.log.batch import MessageBatch
from tidelog.log.config import FlushPolicy, LogConfig
from tidelog.log.contract import AppendGuard, CommitLog, Reader
from tidelog.log.reader import ForwardReader, ReverseReader
from tidelog.log.record import NewRecord, Record
from tidelog.log.recovery import RecoveryReport
from tidelog.log.segmented import SegmentedLog, open_log

__all__ = [
    "AppendGuard",
    "CommitLog",
    "FlushPolicy",
    "ForwardReader",
    "LogConfig",
    "MessageBatch",
    "NewRecord",
    "Reader",
    "Record",
    "RecoveryReport",
    "ReverseReader",
    "SegmentedLog",
    "open_log",
]
