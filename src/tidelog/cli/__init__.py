"""The ``tidelog`` command: ``serve`` runs a server; the other commands are clients of one."""

from tidelog.cli.app import app, main

__all__ = ["app", "main"]
