"""tidelog: a durable, partitioned streaming log.

Layers (imports go down only): ``cli`` -> ``api`` -> ``replication`` -> ``broker`` ->
``store`` / ``log``.
This release contains the storage engine, :mod:`tidelog.log`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tidelog")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
