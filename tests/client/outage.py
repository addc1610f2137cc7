"""A real server that goes down and comes back on the same port and data directory, and a
measure of how long a client takes to notice it is back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.support.server import ServerProcess

from tidelog.client import Client, ClientError, ClientSettings


class Restartable:
    """``tidelog serve`` on one port and data directory, across restarts. ``close()`` it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.process = ServerProcess(data_dir).start()
        self.port = self.process.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def down(self, *, kill: bool) -> None:
        """SIGKILL (a crash) or SIGTERM (a graceful shutdown), and wait for the exit."""
        if kill:
            self.process.kill()
        else:
            self.process.stop()

    def up(self) -> float:
        """Start again on the same port; returns ``time.monotonic()`` at the ready line."""
        self.process = ServerProcess(self.data_dir, "--port", str(self.port)).start()
        assert self.process.port == self.port, "the server came back on another port"
        return time.monotonic()

    def close(self) -> None:
        self.process.kill()


def reconnect_s(
    server: Restartable,
    *,
    outage_s: float,
    kill: bool,
    settings: ClientSettings | None = None,
    poll_s: float = 0.02,
    bound_s: float = 30.0,
) -> float:
    """Seconds from the server's ready line, after ``outage_s`` down, to the first
    ``list_streams`` that succeeds, while a client calls it every ``poll_s`` all along (as an
    application would). A call that began before the ready line and answered after it counts:
    that is what the application sees. ``inf`` if none succeeds within ``bound_s``."""
    successes: list[float] = []
    stop = threading.Event()
    with Client(server.address, settings=settings) as client:
        client.list_streams()

        def poll() -> None:
            while not stop.is_set():
                try:
                    client.list_streams()
                    successes.append(time.monotonic())
                except ClientError:
                    pass
                stop.wait(poll_s)

        server.down(kill=kill)
        poller = threading.Thread(target=poll, name="reconnect-poller", daemon=True)
        poller.start()
        try:
            time.sleep(outage_s)
            successes.clear()
            ready = server.up()
            deadline = ready + bound_s
            while not successes and time.monotonic() < deadline:
                time.sleep(0.005)
        finally:
            stop.set()
            poller.join(bound_s)
    assert not poller.is_alive(), "the polling client never returned"
    # The server accepts calls a moment before its ready line reaches us: that counts as 0.
    return max(successes[0] - ready, 0.0) if successes else float("inf")
