"""The test suite's real server: :class:`tidelog.process.ServerProcess`."""

from tidelog.process import READY, ServerProcess

__all__ = ["READY", "ServerProcess"]
