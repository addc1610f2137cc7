"""The console's sessions: who a browser is, and the token its forms must carry.

A session is found by a random id (32 bytes, URL-safe) that the browser holds in a cookie
(``HttpOnly``, ``SameSite=Lax``, ``Secure`` under TLS); the store keeps only the id's SHA-256,
so the ids are compared as digests and a dump of the store names no usable cookie. Each session
carries its own CSRF token (another 32 random bytes), which every form of the console sends back
in a hidden field and every action checks (``secrets.compare_digest``).

Bounds: a store holds at most ``capacity`` sessions (opening one more ends the oldest) and each
ends ``lifetime_s`` after it was opened, whether used or not; an ended session is never found
again. Pure: the clock is a parameter, so the bounds are tested without waiting.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

DEFAULT_CAPACITY = 1000
DEFAULT_LIFETIME_S = 8 * 3600.0


class Via(StrEnum):
    """How a session's visitor was identified."""

    TOKEN = "token"
    """signed in with a bearer token on the login page"""
    CERTIFICATE = "certificate"
    """the connection's client certificate (mutual TLS on the HTTP port)"""
    OPEN = "open"
    """nothing: a console that needs no login, or a visitor who has not signed in yet"""


@dataclass(frozen=True, slots=True)
class Session:
    """One visitor's session. Its id, CSRF token and bearer token are secrets: left out of its
    ``repr`` (a log line or a traceback's locals must not print them)."""

    id: str = field(repr=False)
    """the cookie's value; the store keeps only its digest"""
    principal: str | None
    """who acts; None: not identified yet (only the login page and the assets are served)"""
    via: Via
    csrf: str = field(repr=False)
    """what each of this session's forms carries back"""
    expires_at: float
    token: str | None = field(default=None, repr=False)
    """the token signed in with (kept in memory only), checked again on each request so that a
    token revoked by a reload ends its sessions"""


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    """A bounded store of expiring sessions (module docstring)."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        lifetime_s: float = DEFAULT_LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1 or lifetime_s <= 0:
            raise ValueError("sessions need a capacity of at least 1 and a positive lifetime")
        self.capacity = capacity
        self.lifetime_s = lifetime_s
        self._clock = clock
        self._by_key: OrderedDict[str, Session] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._by_key)

    def open(self, principal: str | None, via: Via, token: str | None = None) -> Session:
        """A new session; the oldest ends when the store is full."""
        self._expire()
        while len(self._by_key) >= self.capacity:
            self._by_key.popitem(last=False)
        session = Session(
            id=secrets.token_urlsafe(32),
            principal=principal,
            via=via,
            csrf=secrets.token_urlsafe(32),
            expires_at=self._clock() + self.lifetime_s,
            token=token,
        )
        self._by_key[_key(session.id)] = session
        return session

    def find(self, session_id: str | None) -> Session | None:
        """The live session with this id; None for an unknown, ended or expired one."""
        if not session_id:
            return None
        key = _key(session_id)
        session = self._by_key.get(key)
        if session is None:
            return None
        if session.expires_at <= self._clock():
            del self._by_key[key]
            return None
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._by_key.pop(_key(session_id), None)

    def _expire(self) -> None:
        now = self._clock()
        # Lifetimes are equal, so sessions expire in the order they were opened.
        while self._by_key:
            key, oldest = next(iter(self._by_key.items()))
            if oldest.expires_at > now:
                break
            del self._by_key[key]


def csrf_matches(session: Session | None, given: str | None) -> bool:
    """Whether a form's CSRF field is its session's token."""
    if session is None or not given:
        return False
    return secrets.compare_digest(session.csrf.encode(), given.encode())
