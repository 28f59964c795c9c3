"""Renewals arriving together from many hosts' streams on a replica are written by one
statement (a group commit): each lease answered with its own outcome, fencing exact."""

import asyncio

import asyncpg

from amc.v1 import lease_pb2, scheduler_pb2
from tests.support import Farm, HostClient, actions_spec

RENEWED = lease_pb2.RENEWAL_RESULT_RENEWED
CONFLICT = lease_pb2.RENEWAL_RESULT_CONFLICT


async def next_xid(db: asyncpg.Connection) -> int:
    """The transaction id PostgreSQL gives next (asking takes none)."""
    return int(await db.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))


async def hosts_with_a_lease(farm: Farm, n: int) -> list[tuple[HostClient, str]]:
    client = await farm.client()
    out = []
    for i in range(n):
        await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
        host = await farm.host(f"h{i}", "s1")
        out.append((host, (await host.acquire_one("s1")).lease_id))
    return out


async def test_hosts_renewing_together_each_get_their_own_leases_outcomes(farm: Farm) -> None:
    """A lease run out (fenced) and a lease of another host asked for are conflicts for
    the host that asked, in the same group as the renewals that succeed."""
    leased = await hosts_with_a_lease(farm, 12)
    assert farm.db is not None
    expired = leased[3][1]
    await farm.db.execute(
        "UPDATE attempts SET lease_expires_at = now() - interval '1 second'"
        " WHERE lease_id = $1::uuid",
        expired,
    )
    foreign = leased[6][1]  # asked for by h5 too
    answers = await asyncio.gather(
        *(
            host.renew(lease, foreign) if i == 5 else host.renew(lease)
            for i, (host, lease) in enumerate(leased)
        )
    )
    got = [{s.lease_id: s.result for s in states} for states in answers]
    for i, (_, lease) in enumerate(leased):
        want = {lease: CONFLICT if i == 3 else RENEWED}
        if i == 5:
            want[foreign] = CONFLICT
        assert got[i] == want, f"h{i}"
    rows = await farm.db.fetch(
        "SELECT a.lease_id::text, a.host_id, a.lease_expires_at > now() AS live, t.status"
        " FROM attempts a JOIN tasks t USING (task_id)"
    )
    state = {r["lease_id"]: (r["host_id"], r["live"], r["status"]) for r in rows}
    for i, (_, lease) in enumerate(leased):
        if i == 3:  # not renewed, not acknowledged (the expiry sweep may have requeued it)
            assert state[lease][:2] == ("h3", False) and state[lease][2] != "dispatched"
        else:
            assert state[lease] == (f"h{i}", True, "dispatched")


async def test_forty_hosts_renewing_together_take_far_fewer_than_forty_commits(
    farm: Farm,
) -> None:
    leased = await hosts_with_a_lease(farm, 40)
    streams = [host.stream() for host, _ in leased]
    try:
        # Each stream open, its first renewal (the acknowledgement) answered.
        await asyncio.gather(
            *(s.renew(lease) for s, (_, lease) in zip(streams, leased, strict=True))
        )
        assert farm.db is not None
        before = await next_xid(farm.db)
        answers = await asyncio.gather(
            *(s.renew(lease) for s, (_, lease) in zip(streams, leased, strict=True))
        )
        writes = await next_xid(farm.db) - before
        assert [[x.result for x in a] for a in answers] == [[RENEWED]] * 40
        # One commit per group (two statements in flight at most: 1 or 2 here); one per
        # renewal would be 40.
        assert writes <= 10, f"{writes} write transactions for 40 hosts' renewals"
    finally:
        for s in streams:
            await s.close()


async def test_two_renewals_of_one_host_in_a_group_each_answer_their_own_leases(
    farm: Farm,
) -> None:
    """A host renewing on two streams at once (one reconnecting): each renewal is
    answered with the leases it asked about, not the other's."""
    client = await farm.client()
    for _ in range(3):
        await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    one = await farm.host("h0", "s1", "s2")
    other = await farm.host("h1", "s1")
    l1, l2 = (await one.acquire_one("s1")).lease_id, (await one.acquire_one("s2")).lease_id
    l3 = (await other.acquire_one("s1")).lease_id
    assert farm.plane is not None
    leases = farm.plane.store.leases
    ttl = farm.settings.lease_ttl
    answers = await asyncio.gather(
        leases.renew_grouped("h0", [l1], ttl),
        leases.renew_grouped("h0", [l2, l3], ttl),
        leases.renew_grouped("h1", [l3], ttl),
    )
    assert [[str(r.lease_id) for r in a] for a in answers] == [[l1], [l2], [l3]]
