"""The lease-renewal stream: one `RenewLeases` stream per agent for all of its leases.

`LeaseKeeper.run()` keeps the stream open for good (reconnecting with backoff) and sends
a request with every held lease every renew interval (none while it holds no lease, after
the one that opens the stream), plus one at once when a lease is added: that first renewal
acknowledges the assignment, and `acknowledge()` waits for its answer. Answers are matched
to requests by `seq`, so each lease's self-fencing deadline counts from when the renewing
request was *sent*:

    deadline = send time of the request whose answer said RENEWED + valid_for - margin

Each lease (`HeldLease`, host_agent.fencing) has its StopToken armed to trip LEASE_LOST
when the deadline passes (a loop tick early, FENCE_LEAD), whether or not the stream is up:
the host stops acting before the control plane can hand the task to another host. The
token reads the monotonic clock at every check as well as by its timer, so a runner that
resumes after the process was frozen past the deadline finds it tripped before it starts
another action (see `stop_token`).
CONFLICT trips LEASE_LOST at once; `cancel_pending` (in an answer or a push) trips
CANCELLED. The first trip wins. An answer with no leases and no valid_for to a request
that named some renewed nothing (the control plane's database was away): deadlines stand,
the stream stays open, its steps go again with the next request.

Step progress (issue 27.8): `progress()` queues a step that ended; it goes with the next
request that renews its lease (every renew interval: no request of its own), and is sent
again after a stream that broke before the answer. A step of a lease that is forgotten (its
task reported) or conflicted is dropped: the terminal report is the record.

A push with no leases carries the host's drain from the
centre, handed to `on_drain`, the devices an operator released from quarantine, handed
to `on_release`, a viewer's wish for the host's screen call (`screen_wanted`), handed
to `on_screen`, a reader's for its log call (`logs_wanted`), to `on_logs`, and how many
tasks wait for each of the host's emulator pools (`wanted`, handed to `pools.want`;
the pools are told in each stream's first request).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2
from host_agent import metrics
from host_agent.devices import NO_POOLS, Pools
from host_agent.fencing import HeldLease, LeaseAnswer, RenewalResult, Timing
from host_agent.retry import FATAL_CODES, retrying
from host_agent.stop_token import Stopped, StopReason
from host_agent.stream_move import time_to_move

log = structlog.get_logger(__name__)
# A lease whose first renewal went unanswered (the control plane's database away) is asked
# about again this many seconds later, not at the next renew interval.
UNANSWERED_RETRY = 1.0


class StreamBroken(Exception):
    """The renewal stream ended or failed; reconnect."""


class LeaseKeeper:
    """Renews every held lease over one stream, and fences each one by its deadline."""

    def __init__(
        self,
        stub: lease_pb2_grpc.LeaseStub,
        host_id: str,
        timing: Timing,
        *,
        max_backoff: float | None = None,
        on_drain: Callable[[bool], None] | None = None,
        on_release: Callable[[str], None] | None = None,
        on_screen: Callable[[], None] | None = None,
        on_logs: Callable[[], None] | None = None,
        channel: grpc.aio.Channel | None = None,
        may_move: Sequence[Callable[[], Awaitable[None]]] = (),
        pools: Pools = NO_POOLS,
    ) -> None:
        self._stub = stub
        # The stub's channel: when the connection under the stream is left (the control
        # plane's replica aged it out), the stream moves to the channel's next connection,
        # once each of `may_move` returns (the live screens' and logs' calls, open on the old
        # one too, have ended: the stream and the calls stay on one replica).
        self._channel = channel
        self._may_move = may_move
        # Told of the control plane's drain (True) or its end (False); False also when a
        # stream opens: the control plane pushes True at once if the drain still holds.
        self._on_drain = on_drain or (lambda _drain: None)
        # Told of each device an operator released from quarantine (Admin.ReleaseDevice).
        self._on_release = on_release or (lambda _serial: None)
        # Told that a viewer waits for one of the host's phones: open the ScreenFrames call.
        self._on_screen = on_screen or (lambda: None)
        # Told that a reader follows one of the host's attempts' logs: open LogLines.
        self._on_logs = on_logs or (lambda: None)
        self._pools = pools
        self._host_id = host_id
        self.timing = timing
        self._max_backoff = max_backoff
        self._held: dict[str, HeldLease] = {}
        # seq -> time.monotonic() when that request was handed to the stream.
        self._sent: dict[int, float] = {}
        # seq 0 means "push" on the wire, so requests count from 1, across reconnects.
        self._seq = itertools.count(1)
        self._wake = asyncio.Event()
        self._answered = False
        # Steps that ended, by lease, not sent yet; and those sent, by the seq of their
        # request, until its answer (a broken stream sends them again).
        self._steps: dict[str, list[task_pb2.StepResult]] = {}
        self._steps_sent: dict[int, dict[str, list[task_pb2.StepResult]]] = {}

    # -- what the agent calls --------------------------------------------------------------

    def new_lease(
        self, lease_id: str, task_id: str, attempt: int, valid_for: float, received_at: float
    ) -> HeldLease:
        """A lease from an Assignment. Until its first renewal is answered its deadline counts
        from when the assignment arrived: no action happens before that answer anyway."""
        deadline = received_at + valid_for - self.timing.margin
        return HeldLease(lease_id, task_id, attempt, deadline)

    def hold(self, lease: HeldLease) -> None:
        """Start renewing `lease` (at once) and fencing it."""
        lease._first_answer = asyncio.get_running_loop().create_future()
        self._held[lease.lease_id] = lease
        lease.arm()
        self._wake.set()

    async def acknowledge(self, lease: HeldLease) -> LeaseAnswer | None:
        """Hold `lease` and wait for the first answer about it (which acknowledges it).

        None when the token tripped first: the deadline passed with no answer, a pushed
        cancellation arrived, or the host is shutting down (see `lease.token.reason`).
        """
        if lease.lease_id not in self._held:
            self.hold(lease)
        assert lease._first_answer is not None
        try:
            return await lease.token.race(asyncio.shield(lease._first_answer))
        except Stopped:
            return None

    def progress(self, lease_id: str, step: task_pb2.StepResult) -> None:
        """A step of the lease's run that ended: sent with the next renewal of the lease."""
        if lease_id in self._held:
            self._steps.setdefault(lease_id, []).append(step)

    def forget(self, lease_id: str) -> None:
        """Stop renewing and fencing a lease (its task was reported or given back)."""
        self._steps.pop(lease_id, None)
        lease = self._held.pop(lease_id, None)
        if lease is not None:
            lease.token.disarm(StopReason.LEASE_LOST)

    def held(self) -> list[HeldLease]:
        return list(self._held.values())

    # -- the stream ------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep a stream open until cancelled, reconnecting with exponential backoff."""
        while True:
            reconnecting = retrying(
                "renewal stream",
                log,
                retry=lambda exc: isinstance(exc, StreamBroken),
                initial=0.1,
                cap=self._backoff_cap(),
            )
            async for attempt in reconnecting:
                with attempt:
                    await self._session()

    def _backoff_cap(self) -> float:
        # Reconnect well within a renew interval, so a blip costs no lease.
        return self._max_backoff or max(0.2, self.timing.interval)

    async def _session(self) -> None:
        """One stream. Returns when a stream that had worked (answered, and lived a renew
        interval) breaks, to reconnect at once; otherwise raises StreamBroken to back off."""
        self._answered = False
        opened_at = time.monotonic()
        call = self._stub.RenewLeases()
        reader = asyncio.ensure_future(self._read(call))
        sender = asyncio.ensure_future(self._send_every_interval(call))
        moved = asyncio.ensure_future(self._time_to_move())
        try:
            done, _ = await asyncio.wait(
                (reader, sender, moved), return_when=asyncio.FIRST_COMPLETED
            )
            broken = done - {moved}
            if not broken and self._answered:
                log.info("renewal stream moving to a new connection", leases=len(self._held))
                metrics.STREAM_MOVES.inc()
                return  # at once, on the channel's next connection (see host_agent.stream_move)
            error = (
                _stream_error(next(iter(broken)))
                if broken
                else StreamBroken("the connection went away before the stream was answered")
            )
        finally:
            metrics.CONNECTED.set(0)
            await _cancel_all(reader, sender, moved)
            call.cancel()
            self._sent.clear()  # answers to those requests can no longer arrive
            self._resend_steps()
        if self._answered and time.monotonic() - opened_at >= self.timing.interval:
            log.warning("renewal stream broke; reopening", error=str(error))
            return
        raise error

    async def _time_to_move(self) -> None:
        """Returns when the stream should move: its connection is going away, and
        `may_move` allows it."""
        await time_to_move(self._channel, self._may_move)

    async def _send_every_interval(self, call: grpc.aio.StreamStreamCall[Any, Any]) -> None:
        # A wake-up (a new lease) sends only the leases still waiting for their first
        # answer; every interval, all of them. The first request opens the stream (the
        # control plane counts the host connected while it stays open); after it, a host
        # holding no lease sends nothing: HTTP/2 keepalive watches the connection, so an
        # idle host costs the control plane no message per interval.
        next_full = 0.0
        opened = False
        while True:
            self._wake.clear()
            full = time.monotonic() >= next_full
            if self._held or not opened:
                await self._send(call, full, first=not opened)
                opened = True
            if full:
                next_full = time.monotonic() + self.timing.interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_full - time.monotonic())):
                    await self._wake.wait()

    async def _send(
        self, call: grpc.aio.StreamStreamCall[Any, Any], full: bool = True, first: bool = False
    ) -> None:
        seq = next(self._seq)
        lease_ids = [
            lease_id
            for lease_id, lease in self._held.items()
            if not lease.conflicted and (full or lease.unanswered)
        ]
        steps = {i: self._steps.pop(i) for i in lease_ids if i in self._steps}
        if steps:
            self._steps_sent[seq] = steps
        # Taken before the write, so the deadline errs early, never late.
        self._sent[seq] = time.monotonic()
        await call.write(
            lease_pb2.RenewLeasesRequest(
                host_id=self._host_id,
                lease_ids=lease_ids,
                seq=seq,
                steps=[
                    lease_pb2.StepProgress(lease_id=i, step=step)
                    for i, done in steps.items()
                    for step in done
                ],
                pools=[
                    lease_pb2.EmulatorPool(name=name, labels=labels)
                    for name, labels in (self._pools.advertised() if first else [])
                ],
            )
        )

    def _resend_steps(self) -> None:
        """Steps whose request got no answer go with the next stream's first renewal (the
        control plane keeps a step sent twice once)."""
        for sent in sorted(self._steps_sent):
            for lease_id, steps in self._steps_sent[sent].items():
                if lease_id in self._held:
                    self._steps[lease_id] = steps + self._steps.get(lease_id, [])
        self._steps_sent.clear()

    async def _read(self, call: grpc.aio.StreamStreamCall[Any, Any]) -> None:
        while (response := await call.read()) is not grpc.aio.EOF:
            assert isinstance(response, lease_pb2.RenewLeasesResponse)
            if not self._answered:
                log.info("renewal stream open", leases=len(self._held))
                metrics.CONNECTED.set(1)
                self._on_drain(False)
            self._answered = True
            self.on_response(response)

    # -- answers ---------------------------------------------------------------------------

    def on_response(self, response: lease_pb2.RenewLeasesResponse) -> None:
        if response.push:
            if not response.leases:  # the host's drain state (see RenewLeasesResponse.drain)
                self._on_drain(response.drain)
            for serial in response.release_serials:
                self._on_release(serial)
            if response.screen_wanted:
                self._on_screen()
            if response.logs_wanted:
                self._on_logs()
            if response.wanted:
                self._pools.want({w.pool: w.tasks for w in response.wanted})
            for state in response.leases:
                if (lease := self._held.get(state.lease_id)) and state.cancel_pending:
                    self._cancel(lease, "push")
            return
        sent_at = self._sent.pop(response.seq, None)
        steps = self._steps_sent.pop(response.seq, None)
        if sent_at is None:
            log.warning("renewal answer for an unknown request ignored", seq=response.seq)
            return
        if not response.leases and not response.HasField("valid_for"):
            self._unanswered(steps or {})
            return
        valid_for = response.valid_for.ToTimedelta().total_seconds()
        for state in response.leases:
            if (lease := self._held.get(state.lease_id)) is not None:
                self._on_answer(lease, _answer_from(state, valid_for), sent_at)

    def _unanswered(self, steps: dict[str, list[task_pb2.StepResult]]) -> None:
        """The control plane could not reach its database: nothing was renewed (each
        lease's deadline stands) and the stream stays open. The request's steps go with the
        next renewal; a lease still waiting for its first answer is asked about again in
        UNANSWERED_RETRY seconds, not at the next interval."""
        log.info("renewal unanswered: the control plane's database is away", held=len(self._held))
        for lease_id, done in steps.items():
            if lease_id in self._held:
                self._steps[lease_id] = done + self._steps.get(lease_id, [])
        if any(lease.unanswered for lease in self._held.values()):
            asyncio.get_running_loop().call_later(UNANSWERED_RETRY, self._wake.set)

    def _on_answer(self, lease: HeldLease, answer: LeaseAnswer, sent_at: float) -> None:
        if answer.result is RenewalResult.RENEWED:
            if lease.acknowledged_at is None:
                lease.acknowledged_at = sent_at
            lease.extend(sent_at + answer.valid_for - self.timing.margin)
        # The first answer before any trip, so an acknowledging CONFLICT reads as one.
        if lease._first_answer is not None and not lease._first_answer.done():
            lease._first_answer.set_result(answer)
        if answer.result is RenewalResult.CONFLICT:
            lease.conflicted = True
            metrics.LEASE_CONFLICTS.inc()
            lease.stop(StopReason.LEASE_LOST, "lease conflict: stop acting")
        elif answer.cancel_pending:
            self._cancel(lease, "renewal")

    def _cancel(self, lease: HeldLease, via: str) -> None:
        if lease.cancel_seen_via is None:
            lease.cancel_seen_via, lease.cancel_seen_at = via, time.monotonic()
            metrics.CANCELS_SEEN.labels(via).inc()
        event = "cancellation requested: stopping at the next step boundary"
        lease.stop(StopReason.CANCELLED, event, via=via)


def _answer_from(state: lease_pb2.LeaseState, valid_for: float) -> LeaseAnswer:
    if state.result == lease_pb2.RENEWAL_RESULT_RENEWED:
        return LeaseAnswer(RenewalResult.RENEWED, valid_for, state.cancel_pending)
    # Anything but RENEWED in an answer means the lease is not ours to act on.
    return LeaseAnswer(RenewalResult.CONFLICT, 0.0, False)


def _stream_error(task: asyncio.Future[None]) -> StreamBroken:
    """Why the stream ended, as StreamBroken; fatal gRPC errors are raised as they are."""
    exc = task.exception()
    if exc is None:
        return StreamBroken("the control plane ended the renewal stream")
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() in FATAL_CODES:
            raise exc
        return StreamBroken(f"{exc.code().name}: {exc.details()}")
    if isinstance(exc, asyncio.InvalidStateError):
        # Writing to a call that already ended (e.g. after the process was frozen while its
        # replica died): the stream is gone, so reconnect like any other break.
        return StreamBroken(f"the renewal stream had ended: {exc}")
    raise exc


async def _cancel_all(*tasks: asyncio.Future[None]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
