"""The client's event loop: one ``asyncio`` loop on one thread carries every Execute in flight.

A thread blocked in synchronous grpcio wakes every 0.1 s while it waits (grpcio's own
poll for signals), and a build waits on a thousand Execute streams at once: the wake-ups
and the interpreter lock handed among their threads were most of the client's CPU
(issue 45). Here the streams are ``grpc.aio`` calls on one loop; a caller thread blocks
on a :class:`concurrent.futures.Future`, which sleeps until its answer with no wake-up.

Invariants:

- One :class:`EventLoop` per client and process: it starts on first use and a process
  forked after that (doit's process workers) starts its own (a loop, a thread and a
  gRPC channel do not survive ``fork``).
- :class:`ChannelPool` opens :func:`channels_for` channels, each its own connection
  (an HTTP/2 connection carries ~100 streams on common servers), and gives each new
  stream the channel with the fewest in flight.
- :meth:`EventLoop.close` cancels every call in flight (its caller gets the call's
  CANCELLED error) and ends the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc

__all__ = ["STREAMS_PER_CHANNEL", "ChannelPool", "EventLoop", "channels_for"]

T = TypeVar("T")

#: Streams a channel is given before another connection is opened (servers commonly
#: allow 100 per connection; BuildBuddy's limit is 100).
STREAMS_PER_CHANNEL = 80
#: The most channels one client opens.
MAX_CHANNELS = 32


def channels_for(streams: int) -> int:
    """How many channels carry ``streams`` concurrent streams (pure)."""
    return max(1, min(MAX_CHANNELS, -(-max(1, streams) // STREAMS_PER_CHANNEL)))


class EventLoop:
    """One asyncio loop on a daemon thread of this process (see the module docstring)."""

    def __init__(self, name: str = "metrale-remote") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop of this process, started on first use."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coro`` on the loop; its future has the result (or what it raised)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop())

    def close(self, last: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
        """Run ``last`` on the loop (closing channels), then stop the loop and its thread.
        A loop of another process (before a fork) is left alone."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or self._pid != os.getpid():
                return
            self._loop = self._thread = None
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_shutdown(last), loop).result(30)
        # Stopped, not closed: gRPC may still hand the loop a late callback of a call it
        # cancelled, which a closed loop would refuse with an error.
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join(10)


async def _shutdown(last: Callable[[], Coroutine[Any, Any, None]] | None) -> None:
    """Run ``last``, then cancel every task still on the loop and let each end: no
    caller waits on a loop that stopped under its call."""
    if last is not None:
        with contextlib.suppress(Exception):
            await last()
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class ChannelPool:
    """``size`` ``grpc.aio`` channels to ``target``, each its own connection; made on the
    loop that uses them (see the module docstring)."""

    def __init__(
        self,
        target: str,
        *,
        size: int,
        options: Sequence[tuple[str, Any]],
        credentials: grpc.ChannelCredentials | None,
    ) -> None:
        self.target = target
        self.size = size
        self._options = tuple(options)
        self._credentials = credentials
        self._channels: list[grpc.aio.Channel] = []
        #: Streams in flight on each channel (read and written on the loop only).
        self.in_flight: list[int] = []
        #: Streams each channel has carried (tests, the profile).
        self.carried: list[int] = []

    def _open(self) -> None:
        for index in range(self.size):
            # A distinct argument and a subchannel pool of its own: gRPC would otherwise
            # share one connection among channels to the same target.
            options = (
                *self._options,
                ("grpc.channel_pool_index", index),
                ("grpc.use_local_subchannel_pool", 1),
            )
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(self.target, options=options)
            else:
                channel = grpc.aio.secure_channel(self.target, self._credentials, options=options)
            self._channels.append(channel)
        self.in_flight = [0] * self.size
        self.carried = [0] * self.size

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[grpc.aio.Channel]:
        """The channel with the fewest streams in flight, held for the ``async with``."""
        if not self._channels:
            self._open()
        index = min(range(self.size), key=self.in_flight.__getitem__)
        self.in_flight[index] += 1
        self.carried[index] += 1
        try:
            yield self._channels[index]
        finally:
            self.in_flight[index] -= 1

    async def close(self) -> None:
        """Close every channel: calls in flight end CANCELLED."""
        channels, self._channels = self._channels, []
        for channel in channels:
            await channel.close(None)
