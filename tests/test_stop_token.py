"""StopToken: first trip wins, and `race` gives up on its awaitable the moment it trips."""

from __future__ import annotations

import asyncio
import time

import pytest

from host_agent.stop_token import Stopped, StopReason, StopToken
from tests.support import eventually


def test_first_trip_wins_and_later_trips_are_ignored() -> None:
    """THEN the reason recorded is the first one; later trips report they changed nothing."""
    token = StopToken()
    assert not token.tripped and token.reason is None

    assert token.trip(StopReason.CANCELLED) is True
    assert token.trip(StopReason.LEASE_LOST) is False
    assert token.trip(StopReason.SHUTDOWN) is False

    assert token.tripped
    assert token.reason is StopReason.CANCELLED


def test_lease_lost_first_stays_lease_lost_after_a_cancel() -> None:
    """THEN a cancel observed after the lease was lost does not turn it into a cancellation."""
    token = StopToken()
    token.trip(StopReason.LEASE_LOST)
    token.trip(StopReason.CANCELLED)
    assert token.reason is StopReason.LEASE_LOST


def test_raise_if_tripped() -> None:
    token = StopToken()
    token.raise_if_tripped()
    token.trip(StopReason.SHUTDOWN)
    with pytest.raises(Stopped) as info:
        token.raise_if_tripped()
    assert info.value.reason is StopReason.SHUTDOWN
    assert str(info.value) == "stopped: host shutting down"


async def test_wait_returns_the_reason_once_tripped() -> None:
    token = StopToken()
    waiter = asyncio.create_task(token.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    token.trip(StopReason.LEASE_LOST)
    assert await asyncio.wait_for(waiter, 5) is StopReason.LEASE_LOST
    # Already tripped: returns at once.
    assert await token.wait() is StopReason.LEASE_LOST


async def test_race_returns_the_result_when_not_tripped() -> None:
    token = StopToken()

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert await token.race(answer()) == 42
    assert not token._waiters  # nothing left behind


async def test_race_propagates_the_awaitables_exception() -> None:
    token = StopToken()

    async def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await token.race(boom())


async def test_race_stops_promptly_and_cancels_the_inner_call_when_tripped() -> None:
    """THEN race raises Stopped soon after the trip and the inner call saw its cancellation."""
    token = StopToken()
    started, unwound = asyncio.Event(), asyncio.Event()

    async def hang() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()

    racer = asyncio.create_task(token.race(hang()))
    await asyncio.wait_for(started.wait(), 5)
    tripped_at = time.monotonic()
    token.trip(StopReason.CANCELLED)

    with pytest.raises(Stopped) as info:
        await asyncio.wait_for(racer, 5)
    assert info.value.reason is StopReason.CANCELLED
    assert unwound.is_set()  # race waited for the inner call to unwind
    assert time.monotonic() - tripped_at < 2.0


async def test_race_reports_stopped_even_if_the_inner_call_raises_while_unwinding() -> None:
    """THEN a driver that raises on its closed connection still reads as a stop, not a failure."""
    token = StopToken()
    started = asyncio.Event()

    async def driver() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ConnectionResetError("closed") from None

    racer = asyncio.create_task(token.race(driver()))
    await asyncio.wait_for(started.wait(), 5)
    token.trip(StopReason.LEASE_LOST)
    with pytest.raises(Stopped) as info:
        await racer
    assert info.value.reason is StopReason.LEASE_LOST


async def test_race_never_starts_the_awaitable_once_tripped() -> None:
    """THEN the coroutine is closed unstarted (and Python does not warn it was never awaited)."""
    token = StopToken()
    token.trip(StopReason.SHUTDOWN)
    ran = False

    async def work() -> None:
        nonlocal ran
        ran = True

    with pytest.raises(Stopped):
        await token.race(work())
    assert not ran


async def test_cancelling_the_racer_cancels_the_inner_call() -> None:
    token = StopToken()
    started, unwound = asyncio.Event(), asyncio.Event()

    async def hang() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()

    racer = asyncio.create_task(token.race(hang()))
    await asyncio.wait_for(started.wait(), 5)
    racer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await racer
    assert unwound.is_set()
    assert not token._waiters


async def test_race_under_asyncio_timeout_cancels_the_inner_call() -> None:
    """THEN a deadline around race ends it with TimeoutError and the inner call unwound."""
    token = StopToken()
    unwound = asyncio.Event()

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await token.race(hang())
    assert unwound.is_set()
    assert not token.tripped


async def test_many_racers_all_stop_on_one_trip() -> None:
    token = StopToken()
    racers = [asyncio.create_task(token.race(asyncio.sleep(3600))) for _ in range(5)]
    await eventually(lambda: len(token._waiters) == 5, interval=0.005, what="all racers waiting")
    token.trip(StopReason.CANCELLED)
    results = await asyncio.wait_for(asyncio.gather(*racers, return_exceptions=True), 5)
    assert all(isinstance(r, Stopped) for r in results)


async def test_a_trip_between_scheduling_and_starting_keeps_the_action_from_starting() -> None:
    """A trip that lands after race() scheduled the action but before it ran its first
    step (the cancel push read in the same loop turn): the action never begins."""
    token = StopToken()
    started = []

    async def action() -> None:
        started.append(True)

    asyncio.get_running_loop().call_soon(token.trip, StopReason.CANCELLED)
    with pytest.raises(Stopped):
        await token.race(action())
    assert started == []


def freeze_loop(seconds: float) -> None:
    """Block the event loop, as SIGSTOP or a long pause would: no timer runs meanwhile."""
    time.sleep(seconds)


async def test_a_timed_trip_is_seen_by_a_check_after_its_time_even_before_its_timer_ran() -> None:
    """THEN a check after the due time finds the token tripped although the event loop,
    blocked past it, never ran the timer; the announcement runs once, for the trip that
    counts."""
    token, announced = StopToken(), []
    token.trip_at(time.monotonic() + 0.05, StopReason.LEASE_LOST, lambda: announced.append(1))
    assert token.reason is None
    freeze_loop(0.1)  # the timer cannot run
    assert token.tripped
    assert token.reason is StopReason.LEASE_LOST
    with pytest.raises(Stopped):
        token.raise_if_tripped()
    await asyncio.sleep(0.01)  # the overdue timer now runs, and changes nothing
    assert announced == [1]


async def test_the_earliest_overdue_trip_wins_and_a_disarmed_one_never_trips() -> None:
    token = StopToken()
    now = time.monotonic()
    token.trip_at(now + 0.02, StopReason.DEADLINE)
    token.trip_at(now + 0.01, StopReason.LEASE_LOST)
    freeze_loop(0.05)
    assert token.reason is StopReason.LEASE_LOST

    other = StopToken()
    other.trip_at(time.monotonic() + 0.01, StopReason.DEADLINE)
    other.disarm(StopReason.DEADLINE)
    freeze_loop(0.02)
    await asyncio.sleep(0.02)
    assert other.reason is None


async def test_a_timed_trip_interrupts_a_wait_when_it_falls_due() -> None:
    token = StopToken()
    token.trip_at(time.monotonic() + 0.05, StopReason.DEADLINE)
    with pytest.raises(Stopped) as stopped:
        await asyncio.wait_for(token.race(asyncio.sleep(3600)), 5)
    assert stopped.value.reason is StopReason.DEADLINE


async def test_a_timed_trip_does_not_override_an_earlier_trip() -> None:
    token = StopToken()
    token.trip_at(time.monotonic() + 0.01, StopReason.LEASE_LOST)
    assert token.trip(StopReason.CANCELLED)
    freeze_loop(0.02)
    await asyncio.sleep(0.02)
    assert token.reason is StopReason.CANCELLED
