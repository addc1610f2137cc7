"""The remote sites this site replicates to: their ids, addresses and numbers, kept on disk.

Each remote site gets a *number* (0..63), the bit that marks it in a send-queue entry's
destination mask (``envelope.py``), and the send-queue offset from which it counts (``since``).
A number is reused only by a later site, and entries of records below that site's ``since``
are never attributed to it, so a removed site's old entries cannot leak to a new one that took
its number. The registry is one JSON file (``<data_dir>/sites.json``), replaced atomically on
every change; a change that cannot be saved (a full disk) is not made.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from tidelog.broker import replace_json
from tidelog.errors import InvalidArgument, SiteExists, SiteNotFound, echo
from tidelog.sites.envelope import MAX_SITES

SITES_FILE: Final = "sites.json"
_SITE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
_ADDRESS = re.compile(r"[^\s:]+:\d{1,5}")


def validate_site_id(site_id: str) -> str:
    """A site id is 1-63 letters, digits, ``_`` or ``-``, starting with a letter or digit (it
    becomes part of internal stream names)."""
    if not _SITE_ID.fullmatch(site_id):
        raise InvalidArgument(
            f"invalid site id {echo(site_id)}: use 1-63 letters, digits, '_' or '-', starting "
            f"with a letter or digit"
        )
    return site_id


@dataclass(frozen=True, slots=True)
class Site:
    site_id: str
    address: str
    """``HOST:PORT`` of the site's tidelog server."""
    number: int
    since: int
    """Send-queue offset from which records may hold entries for this site."""


class SiteRegistry:
    def __init__(self, local_site: str, path: Path | None, *, save: bool = True) -> None:
        """``path``: the registry's file (None: kept in memory only, its owner saves
        :meth:`document` elsewhere and restores it with :meth:`restore`)."""
        self.local_site = validate_site_id(local_site)
        self.path = path
        self._save_enabled = save and path is not None
        self._sites: dict[str, Site] = {}
        if path is not None and path.exists():
            self._sites = _decode(path)

    def document(self) -> dict[str, Any]:
        """The registry as the JSON document its file holds."""
        return _document(self._sites)

    def restore(self, document: Any, where: str = "the site registry") -> None:
        """Replace the registry with a saved :meth:`document` (None: empty)."""
        self._sites = {} if document is None else _decode_document(document, where)

    def add(self, site_id: str, address: str, since: int) -> Site:
        """Declare a remote site; ``since`` is the send queue's next offset."""
        validate_site_id(site_id)
        if site_id == self.local_site:
            raise InvalidArgument(
                f"{echo(site_id)} is this site's own id: a site replicates to others only"
            )
        _check_address(address)
        if site_id in self._sites:
            raise SiteExists(site_id)
        taken = {site.number for site in self._sites.values()}
        free = [n for n in range(MAX_SITES) if n not in taken]
        if not free:
            raise InvalidArgument(f"{MAX_SITES} remote sites are declared: remove one first")
        site = Site(site_id, address, free[0], since)
        self._change(lambda sites: sites.__setitem__(site_id, site))
        return site

    def move(self, site_id: str, address: str) -> Site:
        """A declared site's new address (its number and ``since`` stay)."""
        site = self.get(site_id)
        _check_address(address)
        moved = Site(site.site_id, address, site.number, site.since)
        self._change(lambda sites: sites.__setitem__(site_id, moved))
        return moved

    def remove(self, site_id: str) -> Site:
        site = self.get(site_id)
        self._change(lambda sites: sites.pop(site_id))
        return site

    def get(self, site_id: str) -> Site:
        site = self._sites.get(site_id)
        if site is None:
            raise SiteNotFound(site_id)
        return site

    def list(self) -> list[Site]:
        return sorted(self._sites.values(), key=lambda s: s.site_id)

    def _change(self, change: Callable[[dict[str, Site]], object]) -> None:
        sites = dict(self._sites)
        change(sites)
        if self._save_enabled:
            assert self.path is not None
            replace_json(self.path, _document(sites), indent=1)
        self._sites = sites


def _check_address(address: str) -> None:
    if not _ADDRESS.fullmatch(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise InvalidArgument(f"invalid address {echo(address)}: give HOST:PORT")


def _document(sites: dict[str, Site]) -> dict[str, Any]:
    return {"version": 1, "sites": [asdict(s) for s in sites.values()]}


def _decode(path: Path) -> dict[str, Site]:
    try:
        document: Any = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise InvalidArgument(f"cannot read the site registry {path}: {error}") from error
    return _decode_document(document, f"the site registry {path}")


def _decode_document(document: Any, where: str) -> dict[str, Site]:
    try:
        if document.get("version") != 1:
            raise ValueError(f"unknown version {document.get('version')!r}")
        sites = [Site(**entry) for entry in document["sites"]]
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise InvalidArgument(f"cannot read {where}: {error}") from error
    return {site.site_id: site for site in sites}
