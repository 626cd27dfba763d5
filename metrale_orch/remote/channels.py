"""The Execute streams' connections: enough channels for the streams a build keeps open.

One HTTP/2 connection carries ~100 concurrent streams on common servers (BuildBuddy's
limit is 100; Bazel's issue 11801); a build keeps ``remote_jobs`` Execute streams open
for as long as its actions run. :class:`ChannelPool` holds :func:`channels_for` channels,
each its own connection, and gives each new stream the one with the fewest in flight.
Thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import grpc

__all__ = ["MAX_CHANNELS", "STREAMS_PER_CHANNEL", "ChannelPool", "channels_for"]

#: Streams a channel is given before another connection is opened.
STREAMS_PER_CHANNEL = 80
#: The most channels one client opens.
MAX_CHANNELS = 32


def channels_for(streams: int) -> int:
    """How many channels carry ``streams`` concurrent streams (pure)."""
    return max(1, min(MAX_CHANNELS, -(-max(1, streams) // STREAMS_PER_CHANNEL)))


class ChannelPool:
    """``size`` channels, the first ``first`` and the others made by ``make(index)``
    (gRPC connects lazily: an unused channel costs no connection)."""

    def __init__(self, first: grpc.Channel, make: Callable[[int], grpc.Channel], size: int) -> None:
        self.channels = [first, *(make(i) for i in range(1, size))]
        self._lock = threading.Lock()
        #: Streams in flight on each channel, and how many each has carried (tests).
        self.in_flight = [0] * size
        self.carried = [0] * size

    @contextlib.contextmanager
    def channel(self) -> Iterator[int]:
        """The index of the channel with the fewest streams in flight, held for the block."""
        with self._lock:
            index = min(range(len(self.channels)), key=self.in_flight.__getitem__)
            self.in_flight[index] += 1
            self.carried[index] += 1
        try:
            yield index
        finally:
            with self._lock:
                self.in_flight[index] -= 1

    def close(self) -> None:
        """Close every channel: calls in flight fail."""
        for channel in self.channels:
            channel.close()
