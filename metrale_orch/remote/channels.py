"""The Execute streams' connections: enough channels for the streams a build keeps open.

One HTTP/2 connection carries ~100 concurrent streams on common servers (BuildBuddy's
limit is 100; Bazel's issue 11801); a build keeps ``remote_jobs`` Execute streams open
for as long as its actions run. :class:`ChannelPool` holds :func:`channels_for` channels,
each its own connection, and gives each new stream the one with the fewest in flight.
It belongs to the event loop its ``grpc.aio`` channels were opened on: only coroutines
on that loop use it, so its counts need no lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import grpc.aio

__all__ = ["MAX_CHANNELS", "STREAMS_PER_CHANNEL", "ChannelPool", "channels_for"]

#: Streams (Execute's, and the calls beside them) a channel is sized for.
STREAMS_PER_CHANNEL = 80
#: The most channels one client opens.
MAX_CHANNELS = 32


def channels_for(streams: int) -> int:
    """How many channels carry ``streams`` concurrent streams (pure)."""
    return max(1, min(MAX_CHANNELS, -(-max(1, streams) // STREAMS_PER_CHANNEL)))


class ChannelPool:
    """``size`` channels made by ``make(index)`` (gRPC connects lazily: an unused channel
    costs no connection). Every call goes to the one with the fewest in flight."""

    def __init__(self, make: Callable[[int], grpc.aio.Channel], size: int) -> None:
        self.channels = [make(i) for i in range(size)]
        #: Streams in flight on each channel, and how many each has carried (tests).
        self.in_flight = [0] * size
        self.carried = [0] * size

    @contextlib.contextmanager
    def channel(self, *, stream: bool = True) -> Iterator[int]:
        """The index of the channel with the fewest calls in flight, held for the block
        (``carried`` counts the Execute streams, ``stream``, alone)."""
        index = min(range(len(self.channels)), key=self.in_flight.__getitem__)
        self.in_flight[index] += 1
        self.carried[index] += stream
        try:
            yield index
        finally:
            self.in_flight[index] -= 1

    async def close(self) -> None:
        """Close every channel: calls in flight fail (CANCELLED) at once."""
        for channel in self.channels:
            await channel.close()
