"""Background flushing for ``FlushPolicy.INTERVAL``: one thread serves every open log.

Each registered log is flushed when its interval has passed since its last flush; a log with
nothing new to sync costs one clock read. The thread starts with the first registration and sleeps
on an event between due times, so an idle process does no work.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

LOG = logging.getLogger("tidelog.log.flush")


class Flushable(Protocol):
    def flush(self) -> None: ...


class Flusher:
    """Calls ``flush()`` on each registered object every ``interval`` seconds (its own interval)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._due: dict[int, tuple[Flushable, float, float]] = {}
        self._thread: threading.Thread | None = None

    def register(self, target: Flushable, interval_s: float) -> None:
        with self._lock:
            self._due[id(target)] = (target, interval_s, time.monotonic() + interval_s)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="tidelog-flusher", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def unregister(self, target: Flushable) -> None:
        with self._lock:
            self._due.pop(id(target), None)

    def _run(self) -> None:
        while True:
            now = time.monotonic()
            ready: list[Flushable] = []
            with self._lock:
                if not self._due:
                    self._thread = None
                    return
                for key, (target, interval, due) in list(self._due.items()):
                    if due <= now:
                        ready.append(target)
                        self._due[key] = (target, interval, now + interval)
                next_due = min(due for _, _, due in self._due.values())
            for target in ready:
                try:
                    target.flush()
                except Exception:  # a log closed meanwhile, a full disk: keep serving the others
                    LOG.exception("background flush failed")
            self._wake.wait(max(0.0, next_due - time.monotonic()))
            self._wake.clear()


DEFAULT_FLUSHER = Flusher()
