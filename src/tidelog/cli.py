"""The ``tidelog`` command. Only ``--version`` works yet; the server and client commands arrive with
the broker (issue 3), and this entry point says so instead of pretending."""

from __future__ import annotations

import sys

from tidelog import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["version"]):
        print(f"tidelog {__version__}")
        return 0
    print(
        "tidelog: only the storage engine (tidelog.log) exists in this release; "
        "`tidelog serve` and the client commands are not built yet.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
