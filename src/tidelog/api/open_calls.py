"""The calls being served, each with who made it and what it was admitted for, so that a reload
of the credentials or the ACL reaches the calls already open, not only the next ones.

A subscription or a publish stream can stay open for days. When a SIGHUP revokes a token or a
grant, :meth:`OpenCalls.recheck` asks the new authenticator and the new policy about every open
call again: a call whose caller is no longer named the same (a revoked token) or no longer
allowed what it was admitted for is ended, ``UNAUTHENTICATED`` or ``PERMISSION_DENIED`` with the
refusal's own message, as if it had been made now. A request stream's frames are checked against
the live policy as they arrive, and what they touched is added to what a recheck asks about.

Invariant: after ``recheck`` returns, no open call holds an access the current policy refuses
its caller (each refused one has been told to end; its task ends at its next await).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from tidelog.access import Access, Guard
from tidelog.errors import TidelogError, Unauthenticated

MAX_TRACKED_ACCESSES: Final = 256
"""Distinct accesses remembered per call (a publish stream naming many streams): beyond it a
call's further frames are still checked as they come, and a recheck asks about the first ones."""


@dataclass(eq=False)
class OpenCall:
    identity: str
    auth_context: Any
    metadata: Any
    task: asyncio.Task[Any] | None
    accesses: set[Access] = field(default_factory=set)
    revoked: TidelogError | None = None
    """Why a recheck ended the call (its wrapper answers with it)."""

    def touched(self, accesses: Iterable[Access]) -> None:
        for access in accesses:
            if len(self.accesses) >= MAX_TRACKED_ACCESSES:
                return
            self.accesses.add(access)


class OpenCalls:
    def __init__(self) -> None:
        self._calls: set[OpenCall] = set()

    def __len__(self) -> int:
        return len(self._calls)

    def open(self, identity: str, auth_context: Any, metadata: Any) -> OpenCall:
        call = OpenCall(identity, auth_context, metadata, _current_task())
        self._calls.add(call)
        return call

    def close(self, call: OpenCall) -> None:
        self._calls.discard(call)

    def recheck(self, identify: Callable[[Any, Any], str], guard: Guard) -> list[OpenCall]:
        """End every open call its caller may no longer make (module docstring); returns them."""
        ended = []
        for call in list(self._calls):
            try:
                if identify(call.auth_context, call.metadata) != call.identity:
                    # the same credentials now name someone else: as good as revoked
                    raise Unauthenticated("the credentials of this call were revoked")
                guard.check(call.identity, tuple(call.accesses))
            except TidelogError as error:
                call.revoked = error
            if call.revoked is not None:
                ended.append(call)
                self._calls.discard(call)
                if call.task is not None:
                    call.task.cancel()
        return ended


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
