"""A host's call to the control plane that is open only while wanted: opened when the
control plane asks (`want()`), closed after a linger with nothing asked of it, opened again
after a pause when it broke while in use (the live screens' and the live logs' calls).

A subclass says how the call is opened and greeted, what the control plane's messages ask
(`_heard`), whether anything is asked now (`_in_use`), what forgetting it means (`_forget`)
and what it sends (`_send`, one task for the call's life). The pause after a break doubles
from RECONNECT_FIRST to RECONNECT_MOST and starts again after a call that lasted longer
than that or ended by its linger.
"""

from __future__ import annotations

import abc
import asyncio
import time
from typing import Any

import grpc
import structlog

log = structlog.get_logger(__name__)

RECONNECT_FIRST, RECONNECT_MOST = 0.5, 10.0
# A bidirectional call, whatever its messages.
Call = grpc.aio.StreamStreamCall[Any, Any]


class OnDemandCall(abc.ABC):
    """One call of the host's, open while the control plane wants it."""

    # Said in the agent's log: the control plane has no such service; the call ended; the
    # call closed for nothing asked during the linger.
    ABSENT = "the control plane does not take this call"
    ENDED = "call ended"
    LINGERED = "nothing asked for the linger: call closed"

    def __init__(self, linger: float) -> None:
        self._linger = linger
        # Set when the control plane asks for the call (`want()`).
        self._wanted = asyncio.Event()
        # The call is open now (it has had its first answer).
        self.calling = False
        # Set while no call is open at all (`closed()`).
        self._closed = asyncio.Event()
        self._closed.set()

    def want(self) -> None:
        """The control plane asks for the call: opened now, or again as soon as the open
        one ends."""
        self._wanted.set()

    async def closed(self) -> None:
        """Returns when no call is open (at once if none is). The renewal stream waits for
        it before moving to a new connection: the call, open on the old one, and the stream
        stay on one replica, where the host's readers look for it."""
        await self._closed.wait()

    @abc.abstractmethod
    def _open(self) -> Call:
        """The call, opened (nothing written yet)."""

    @abc.abstractmethod
    def _hello(self) -> object:
        """The call's first message: who is calling."""

    @abc.abstractmethod
    def _in_use(self) -> bool:
        """Anything asked of the call now (then no linger runs)."""

    @abc.abstractmethod
    def _heard(self, message: Any) -> None:
        """One message of the control plane's: what it asks now."""

    @abc.abstractmethod
    def _forget(self) -> None:
        """The call is over: nothing is asked of it any more."""

    @abc.abstractmethod
    async def _send(self, call: Call) -> None:
        """What goes up, one write at a time, until a write fails (the call is over; its
        read says why)."""

    async def _keep(self) -> None:
        """The call, for the agent's life, whenever it is wanted."""
        pause = RECONNECT_FIRST
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            opened = time.monotonic()
            lingered = False
            try:
                lingered = await self._call()
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info(self.ABSENT)
                    return
                log.info(self.ENDED, code=exc.code().name, details=exc.details())
            if not lingered and self._in_use():
                self._wanted.set()  # broken while in use: open it again
            self._forget()
            if lingered:
                pause = RECONNECT_FIRST
                continue
            if time.monotonic() - opened > RECONNECT_MOST:
                pause = RECONNECT_FIRST
            await asyncio.sleep(pause)
            pause = min(RECONNECT_MOST, pause * 2)

    async def _call(self) -> bool:
        """One call, until it ends (False) or nothing has been asked of it for the linger
        (True: closed here)."""
        call = self._open()
        sender: asyncio.Task[None] | None = None
        self._closed.clear()
        try:
            await call.write(self._hello())
            sender = asyncio.get_running_loop().create_task(self._send(call))
            while True:
                try:
                    async with asyncio.timeout(None if self._in_use() else self._linger):
                        message = await call.read()
                except TimeoutError:
                    log.info(self.LINGERED)
                    return True
                if message is grpc.aio.EOF:
                    return False
                self.calling = True
                self._heard(message)
        finally:
            self.calling = False
            self._closed.set()
            if sender is not None:
                sender.cancel()
            call.cancel()
