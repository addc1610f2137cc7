"""The child side of ``test_gufo_follows_a_leader_move``: gufo-liftbridge, unmodified, seeded with
every broker, reads a stream from the start (printing each message's offset and value as one
JSON line), and after ``COUNT`` messages publishes ``EXTRA`` of its own to some broker and reads
them too. Run as ``python gufo_follower.py COUNT EXTRA ADDRESS...``; it never imports tidelog."""

from __future__ import annotations

import asyncio
import json
import sys


async def main(count: int, extra: int, seeds: list[str]) -> None:
    from gufo.liftbridge.client import LiftbridgeClient
    from gufo.liftbridge.types import StartPosition

    async with LiftbridgeClient(seeds) as lb:
        seen = 0
        async for message in lb.subscribe("s", partition=0, start_position=StartPosition.EARLIEST):
            print(json.dumps([message.offset, message.value.decode()]), flush=True)
            seen += 1
            if seen == count:
                for n in range(extra):
                    await lb.publish(b"gufo-%d" % n, stream="s", partition=0)
            if seen == count + extra:
                return


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
