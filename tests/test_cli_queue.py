"""`amc queue` (the queue by selector and by fairness key), `amc queue set` and `amc queue
show` (a key's share of the phones, who set it and why), `amc submit --fairness-key` and
the spec file's `fairness_key`, token teams (`amc tokens create --team`): as real `amc`
processes against a live control plane, asserting what they print and what the database
holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.domain import Role
from tests.support import Farm, eventually
from tests.test_cli import TAP, Cli, Run, amc

__all__ = ["amc"]


async def _shares(farm: Farm) -> list[tuple[str, int, int | None]]:
    assert farm.db is not None
    rows = await farm.db.fetch("SELECT * FROM fair_shares ORDER BY fairness_key")
    return [(r["fairness_key"], r["weight"], r["max_devices"]) for r in rows]


async def _events(farm: Farm) -> list[tuple[str, int, int | None, str, str]]:
    assert farm.db is not None
    rows = await farm.db.fetch("SELECT * FROM fair_share_events ORDER BY event_id")
    return [
        (r["fairness_key"], r["weight"], r["max_devices"], r["actor_name"], r["reason"])
        for r in rows
    ]


def _find(run: Run, first: str) -> list[str] | None:
    """The cells of the table row of `run` whose first cell is `first` (None: no such row)."""
    for line in run.out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if cells[0] == first:
            return cells
    return None


def _row(run: Run, first: str) -> list[str]:
    cells = _find(run, first)
    assert cells is not None, f"no row {first!r} in:\n{run.out}"
    return cells


async def test_queue_set_sets_a_keys_share_and_queue_show_says_who_and_why(
    amc: Cli, farm: Farm
) -> None:
    """THEN `amc queue set` writes the share and an event with the operator's token and
    the reason, prints the share; --no-cap removes the cap and keeps the weight; `amc
    queue show` lists the changes newest first."""
    run = await amc("queue", "set", "qa", "--weight", "3", "--max-devices", "2", "-r", "lab")
    assert run.code == 0, run.err
    assert run.out.strip() == "fairness key qa: weight 3, cap 2 phones; 0 queued, 0 running"
    cleared = await amc("queue", "set", "qa", "--no-cap", "--reason", "release over")
    assert cleared.out.strip() == "fairness key qa: weight 3, no cap; 0 queued, 0 running"
    assert await _shares(farm) == [("qa", 3, None)]
    assert await _events(farm) == [
        ("qa", 3, 2, "test", "lab"),
        ("qa", 3, None, "test", "release over"),
    ]
    shown = await amc("queue", "show", "qa")
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0] == "fairness key qa: weight 3, no cap; 0 queued, 0 running"
    changes = [[c.strip() for c in line.split("│")][1:] for line in lines if "test (" in line]
    assert [(c[0], c[1], c[3]) for c in changes] == [("3", "-", "release over"), ("3", "2", "lab")]
    doc = (await amc("queue", "show", "qa", "-o", "json")).json()
    assert [e["reason"] for e in doc["events"]] == ["release over", "lab"]
    assert doc["share"]["weight"] == 3 and "max_devices" not in doc["share"]


async def test_queue_prints_the_queue_by_selector_and_by_key(amc: Cli, farm: Farm) -> None:
    """THEN once counted, `amc queue` has a row per selector (queued, oldest wait, devices,
    why) and per fairness key (queued, running, cap, weight, oldest wait); -o json has both."""
    host = await farm.host("h1", "s1", rack="r1")
    assert (await amc("queue", "set", "qa", "--weight", "2", "--max-devices", "5")).code == 0
    for key in ("qa", "qa", "qa", "ci"):
        await amc.submit("-", "-l", "rack=r1", "--fairness-key", key, stdin=TAP)
    await host.acquire("s1")

    async def counted() -> Run | None:
        run = await amc("queue")
        qa = _find(run, "qa")
        return run if qa and qa[1:5] == ["2", "1", "5", "2"] else None

    run = await eventually(counted, what="the queue counted")
    assert run.code == 0, run.err
    assert _row(run, "qa")[1:5] == ["2", "1", "5", "2"]
    assert _row(run, "ci")[1:5] == ["1", "0", "-", "1"]
    assert _row(run, "qa")[5].endswith("s")
    selector = _row(run, "rack=r1")
    assert (selector[1], selector[3], selector[4]) == (
        "3",
        "0/1/0",
        "1 matching device, busy",
    )
    assert "3 queued in all; counted 20" in run.out
    doc = (await amc("queue", "-o", "json")).json()
    assert doc["total"] == 3 and doc["counted_at"]
    assert {s["fairness_key"]: (s["queued"], s["running"]) for s in doc["fair_shares"]} == {
        "qa": (2, 1),
        "ci": (1, 0),
    }


BAD_SETS = [
    (["queue", "set", "qa"], "nothing to set"),
    (["queue", "set", "qa", "--max-devices", "3", "--no-cap"], "not both"),
    (["queue", "set", "qa", "--weight", "0"], "--weight"),
    (["queue", "set", "qa", "--weight", "1001"], "--weight"),
    (["queue", "set", "qa", "--max-devices", "-1"], "--max-devices"),
    (["queue", "set", "qa", "--max-devices", "100001"], "max_devices: must be between 0"),
    (["queue", "set", "qa", "--max-devices", "99999999999"], "--max-devices"),  # "unexpected"
    (["queue", "set", "has space", "--weight", "2"], "fairness_key: may hold"),
    (["queue", "set", "qa", "--weight", "2", "--reason", "r" * 2000], "reason:"),
]


@pytest.mark.parametrize(("args", "says"), BAD_SETS)
async def test_a_bad_queue_set_exits_2_naming_what_is_wrong_and_changes_nothing(
    amc: Cli, farm: Farm, args: list[str], says: str
) -> None:
    assert (await amc("queue", "set", "qa", "--weight", "4")).code == 0
    before = (await _shares(farm), await _events(farm))
    run = await amc(*args)
    assert run.code == 2, run.err
    assert says in run.assert_one_error_line()
    assert (await _shares(farm), await _events(farm)) == before


async def test_queue_is_for_operators(farm: Farm) -> None:
    """THEN a client token gets exit 6 from `amc queue` and `amc queue set`."""
    client = Cli(farm.address, await farm.token(Role.CLIENT))
    for args in (["queue"], ["queue", "set", "qa", "--weight", "2"]):
        run = await client(*args)
        assert run.code == 6, run.err
        assert "PERMISSION_DENIED" in run.assert_one_error_line()
    assert await _shares(farm) == []


async def test_submit_takes_a_fairness_key_from_the_flag_or_the_file_and_get_shows_it(
    amc: Cli, farm: Farm, tmp_path: Path
) -> None:
    """THEN the file's `fairness_key` is the task's key, --fairness-key wins over it, and
    `amc get` shows the key; a bad key is refused naming the field, nothing queued."""
    spec = tmp_path / "nightly.yaml"
    spec.write_text("fairness_key: nightly\n" + TAP)
    from_file = await amc.submit(str(spec))
    from_flag = await amc.submit(str(spec), "--fairness-key", "release")
    plain = await amc.submit("-", stdin=TAP)
    keys = [t["fairness_key"] for t in (from_file, from_flag, plain)]
    assert keys == ["nightly", "release", "default"]
    for task, key in ((from_file, "nightly"), (from_flag, "release")):
        assert (await farm.task_row(task["task_id"]))["fairness_key"] == key
    shown = await amc("get", from_file["task_id"])
    assert _key_line(shown) == "fairness key  nightly"
    bad = await amc("submit", "-", "--fairness-key", "a b", stdin=TAP)
    assert bad.code == 2 and "fairness_key:" in bad.assert_one_error_line()
    typo = tmp_path / "typo.yaml"
    typo.write_text("fairness_keys: nightly\n" + TAP)
    refused = await amc("submit", str(typo))
    assert refused.code == 2 and "did you mean 'fairness_key'" in refused.assert_one_error_line()
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 3


def _key_line(run: Run) -> str:
    line = next(line for line in run.out.splitlines() if line.startswith("fairness key"))
    return "fairness key  " + line.split()[-1]


async def test_a_token_made_with_a_team_submits_into_its_teams_key(amc: Cli, farm: Farm) -> None:
    """THEN `amc tokens create --team qa` makes a token whose tasks count in key qa, `amc
    tokens list` shows the team, and a host token with a team is refused naming `team`."""
    made = await amc("tokens", "create", "--role", "client", "--name", "qa-ci", "--team", "qa")
    assert made.code == 0, made.err
    assert "of team qa" in made.err
    qa = Cli(farm.address, made.out.strip())
    task = await qa.submit("-", stdin=TAP)
    assert (await farm.task_row(task["task_id"]))["fairness_key"] == "qa"
    listed = await amc("tokens", "list")
    line = next(line for line in listed.out.splitlines() if "qa-ci" in line)
    assert [c.strip() for c in line.split("│")][1:5] == ["qa-ci", "client", "-", "qa"]
    host = await amc("tokens", "create", "--role", "host", "--host-id", "h1", "--team", "qa")
    assert host.code == 2 and "team:" in host.assert_one_error_line()


def test_waits_read_as_a_person_writes_them() -> None:
    """THEN `amc queue` writes a wait as 42s, 5m12s, 3h05m, 2d4h."""
    import time

    from google.protobuf import timestamp_pb2

    from amc_cli.render import waited

    def ago(seconds: float) -> timestamp_pb2.Timestamp:
        ts = timestamp_pb2.Timestamp()
        ts.FromSeconds(int(time.time() - seconds))
        return ts

    assert [waited(ago(s)) for s in (42, 312, 3 * 3600 + 300, 2 * 86400 + 4 * 3600)] == [
        "42s",
        "5m12s",
        "3h05m",
        "2d4h",
    ]
    assert waited(timestamp_pb2.Timestamp()) == "-"
