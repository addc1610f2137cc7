"""The remote sites this site replicates to: their ids, addresses and numbers, kept on disk.

Each remote site gets a *number* (0..63), the bit that marks it in a send-queue entry's
destination mask (``envelope.py``): the lowest number no declared site holds, so a number freed
by a removal is taken by the next site declared. It also gets the send-queue offset from which
it counts (``since``): entries of records below a site's ``since`` are never attributed to it,
so a removed site's old entries cannot leak to a later one that took its number.

The registry also keeps what the source learned from its sinks about positions
(``positions.py``): the lift segments, and per site whether its sink was heard since it was
declared (``heard``), its own lift, and a snapshot sync it is owed (``resync``) after it
reported a position this queue never gave; and the lift of snapshot ids (``snapshot_lift``,
``snapshots.py``). They are part of the same document because a position must mean the same
thing after a restart as before: a lift that was used and then lost would give the next entries
positions the sink has.

Invariant: every lifted site's ``lifted_below`` is where a segment starts, whose lift is at
least the site's own. A change at an ``end`` below a segment (the queue lost records) drops it;
the sites lifted below it then count from ``end`` (:meth:`SiteRegistry._changed_at`).

The registry is one JSON file (``<data_dir>/sites.json``), replaced atomically on every change; a
change that cannot be saved (a full disk) is not made. Fields at their defaults are left out.
The document is version 1 when it holds nothing else, so a registry that never learned anything
is read by the versions from before lifts; one that holds any of the fields they do not know
says version 2, which they refuse (they would ignore the lifts, and give positions again). Both
versions are read.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tidelog.durable import replace_json
from tidelog.errors import InvalidArgument, SiteExists, SiteNotFound, echo
from tidelog.sites.envelope import MAX_SITES
from tidelog.sites.positions import Positions, plausible

SITES_FILE: Final = "sites.json"
VERSIONS: Final = (1, 2)
"""1: what the versions before lifts read and write; 2: with fields they do not know."""
_FIRST_FIELDS: Final = frozenset({"site_id", "address", "number", "since"})
_SITE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_ADDRESS = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\]):\d{{1,5}}")
"""``HOST:PORT``: a host name or an IPv4 address, or an IPv6 address in brackets. Host names
may hold ``_``: not a DNS host name's character, but Docker Compose service names and SRV-style
names have it, and resolvers answer for them."""


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
    heard: bool = True
    """Its sink was heard (it answered a hello) since it was declared; until then, a position
    it reports may be from an older queue of this site (``positions.py``). A registry from
    before this field counts its sites heard."""
    lift: int = 0
    """Records by which its entries below ``lifted_below`` are lifted (0: none)."""
    lifted_below: int = 0
    """Where its own lift ends and the global segments take over (a segment starts there)."""
    resync: str = ""
    """Why it is owed a snapshot sync (empty: it is not), kept until one is applied."""


class SiteRegistry:
    def __init__(self, local_site: str, path: Path | None, *, save: bool = True) -> None:
        """``path``: the registry's file (None: kept in memory only, its owner saves
        :meth:`document` elsewhere and restores it with :meth:`restore`)."""
        self.local_site = validate_site_id(local_site)
        self.path = path
        self._save_enabled = save and path is not None
        self._sites: dict[str, Site] = {}
        self.positions = Positions()
        """The lift segments every record's position goes through (``positions.py``)."""
        self.snapshot_lift = 0
        """Added to a snapshot request's offset to make its id (``snapshots.py``); only grows."""
        if path is not None and path.exists():
            self._sites, self.positions, self.snapshot_lift = _decode(path)

    def document(self) -> dict[str, Any]:
        """The registry as the JSON document its file holds."""
        return _document(self._sites, self.positions, self.snapshot_lift)

    def restore(self, document: Any, where: str = "the site registry") -> None:
        """Replace the registry with a saved :meth:`document` (None: empty)."""
        if document is None:
            self._sites, self.positions, self.snapshot_lift = {}, Positions(), 0
        else:
            self._sites, self.positions, self.snapshot_lift = _decode_document(document, where)

    def positions_for(self, site: Site) -> Positions:
        """The positions ``site`` sees (its own lift, if any, then the global segments)."""
        return self.positions.for_site(site.since, site.lift, site.lifted_below)

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
        site = Site(site_id, address, free[0], since, heard=False)
        self._change(lambda sites: sites.__setitem__(site_id, site))
        return site

    def move(self, site_id: str, address: str) -> Site:
        """A declared site's new address (its number, ``since`` and what was learned stay)."""
        site = self.get(site_id)
        _check_address(address)
        moved = dataclasses.replace(site, address=address)
        self._change(lambda sites: sites.__setitem__(site_id, moved))
        return moved

    def heard(self, site_id: str) -> Site:
        """Its sink answered, reporting nothing this queue did not give it."""
        return self._replace(self.get(site_id), heard=True)

    def lift(self, site_id: str, learned: int, end: int) -> Site:
        """A site not heard before reported position ``learned`` of an older queue: lift its
        entries above it (``Positions.lifted``; ``end``: the queue's next offset)."""
        site = self.get(site_id)
        positions, by = self.positions.lifted(site.since, learned, end)
        lifted = dataclasses.replace(site, heard=True, lift=by, lifted_below=end)
        self._changed_at(end, positions, {site_id: lifted})
        return lifted

    def refuse(self, site_id: str, learned: int, end: int, reason: str) -> Site:
        """A heard site reported position ``learned``, which this queue never gave: raise the
        floor past it and owe the site a snapshot sync (``reason``)."""
        site = self.get(site_id)
        positions = self.positions.raised(learned, end)
        refused = dataclasses.replace(site, heard=True, resync=reason)
        self._changed_at(end, positions, {site_id: refused})
        return refused

    def fit_queue_end(self, end: int, acked: Mapping[str, int]) -> list[Site]:
        """At open, before any transmit: fit the registry to a queue whose next offset is
        ``end``, its sites' sinks having acknowledged ``acked`` (site id -> position, as the
        upkeep saved them). Where any of them, or a lift segment, is at or past ``end``, the
        queue lost records it had given out: the floor rises above every position known given
        (:meth:`Positions.raised`), each site whose acknowledgement is past the end is owed a
        snapshot sync, and a site declared past the end counts from it (every record from
        there on was stored after it was declared). Returns the sites newly owed a snapshot;
        changes nothing when nothing is past the end."""
        past_end = self.positions.position(end)
        believed = {k: v for k, v in acked.items() if k in self._sites and plausible(v)}
        beyond = {k: v for k, v in believed.items() if v >= past_end}
        if not (
            beyond
            or any(start >= end for start, _ in self.positions.segments)
            or any(site.since > end for site in self._sites.values())
        ):
            return []
        positions = self.positions.raised(max(beyond.values(), default=-1), end)
        owed = sorted(k for k in beyond if not self._sites[k].resync)
        changes: dict[str, Site] = {}
        for site_id, site in self._sites.items():
            changed = dataclasses.replace(site, since=min(site.since, end))
            if site_id in owed:
                changed = dataclasses.replace(
                    changed,
                    resync=(
                        f"refused: site {site_id} acknowledged position {beyond[site_id]}, beyond "
                        f"this queue's end (its next position was {past_end}: this source lost "
                        f"entries it had sent it); new entries take positions above it, and the "
                        f"site gets a snapshot sync"
                    ),
                )
            if changed != site:
                changes[site_id] = changed
        self._changed_at(end, positions, changes)
        return [self._sites[k] for k in owed]

    def snapshot_ids_above(self, site_id: str, seen: int, next_offset: int) -> Site:
        """Site ``site_id``'s sink reported snapshot id ``seen`` (an older incarnation's):
        lift the ids so that the request at ``next_offset`` (the requests' next offset) and
        every later one take an id above it. Returns the site."""
        site = self.get(site_id)
        lift = max(self.snapshot_lift, seen + 1 - next_offset)
        if lift != self.snapshot_lift:
            self._change(lambda sites: None, snapshot_lift=lift)
        return site

    def resynced(self, site_id: str) -> Site:
        """The snapshot sync the site was owed is applied."""
        return self._replace(self.get(site_id), resync="")

    def _replace(self, site: Site, **changes: Any) -> Site:
        changed = dataclasses.replace(site, **changes)
        if changed != site:
            self._change(lambda sites: sites.__setitem__(site.site_id, changed))
        return changed

    def remove(self, site_id: str) -> Site:
        site = self.get(site_id)
        self._change(lambda sites: sites.pop(site_id))
        return site

    def get(self, site_id: str) -> Site:
        site = self._sites.get(site_id)
        if site is None:
            raise SiteNotFound(site_id)
        return site

    def declared(self, site_id: str) -> bool:
        return site_id in self._sites

    def list(self) -> list[Site]:
        return sorted(self._sites.values(), key=lambda s: s.site_id)

    def _changed_at(self, end: int, positions: Positions, changes: dict[str, Site]) -> None:
        """Make ``changes`` with the segments ``positions``, from a change at the queue's next
        offset ``end``: a site lifted below a segment that starts past ``end`` (dropped) counts
        from ``end``, where the change's segment starts (the module's invariant)."""
        sites = {**self._sites, **changes}
        for site_id, site in sites.items():
            if site.lift and site.lifted_below > end:
                sites[site_id] = dataclasses.replace(site, lifted_below=end)
        if sites == self._sites and positions == self.positions:
            return
        self._change(lambda current: current.update(sites), positions)

    def _change(
        self,
        change: Callable[[dict[str, Site]], object],
        positions: Positions | None = None,
        *,
        snapshot_lift: int | None = None,
    ) -> None:
        sites = dict(self._sites)
        change(sites)
        positions = positions or self.positions
        lift = self.snapshot_lift if snapshot_lift is None else snapshot_lift
        if self._save_enabled:
            assert self.path is not None
            replace_json(self.path, _document(sites, positions, lift), indent=1)
        self._sites = sites
        self.positions = positions
        self.snapshot_lift = lift


def _check_address(address: str) -> None:
    if (
        len(address) > 261
        or not _ADDRESS.fullmatch(address)
        or not 0 < int(address.rsplit(":", 1)[1]) < 65536
    ):
        raise InvalidArgument(
            f"invalid address {echo(address)}: give HOST:PORT (a DNS name, an IPv4 address or "
            f"[an IPv6 address], and a port 1-65535)"
        )


_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(Site) if f.default is not dataclasses.MISSING
}


def _entry(site: Site) -> dict[str, Any]:
    """A site as the document keeps it: fields at their defaults left out."""
    entry = dataclasses.asdict(site)
    return {k: v for k, v in entry.items() if k not in _DEFAULTS or v != _DEFAULTS[k]}


def _document(sites: dict[str, Site], positions: Positions, snapshot_lift: int) -> dict[str, Any]:
    entries = [_entry(s) for s in sites.values()]
    document: dict[str, Any] = {"version": 1, "sites": entries}
    if positions.segments:
        document["lifts"] = [list(segment) for segment in positions.segments]
    if snapshot_lift:
        document["snapshot_lift"] = snapshot_lift
    if len(document) > 2 or any(entry.keys() - _FIRST_FIELDS for entry in entries):
        document["version"] = 2  # the versions before lifts must not read it (module docstring)
    return document


def _decode(path: Path) -> tuple[dict[str, Site], Positions, int]:
    try:
        document: Any = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise InvalidArgument(f"cannot read the site registry {path}: {error}") from error
    return _decode_document(document, f"the site registry {path}")


def _decode_document(document: Any, where: str) -> tuple[dict[str, Site], Positions, int]:
    """Either version (the version before this one wrote its new fields under version 1)."""
    try:
        if document.get("version") not in VERSIONS:
            raise ValueError(f"unknown version {document.get('version')!r}")
        sites = [Site(**entry) for entry in document["sites"]]
        positions = Positions([(int(s), int(b)) for s, b in document.get("lifts", ())])
        snapshot_lift = int(document.get("snapshot_lift", 0))
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise InvalidArgument(f"cannot read {where}: {error}") from error
    return {site.site_id: site for site in sites}, positions, snapshot_lift
