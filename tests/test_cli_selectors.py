"""`amc submit` and a selector no registered device fits: a warning naming the nearest
label key, value or serial there is, the task queued anyway; `--strict` refuses it. The
real CLI against a live control plane with registered devices."""

from __future__ import annotations

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli.selectors import problems
from control_plane.domain import Role
from tests.support import Farm
from tests.test_cli import TAP, Cli, amc

__all__ = ["amc"]


async def test_a_misspelt_label_key_is_warned_of_with_the_nearest_and_still_queued(
    amc: Cli, farm: Farm
) -> None:
    """THEN one warning line names the key and the nearest real one; the task is queued."""
    await farm.host("h1", "s1", rack="a1")
    run = await amc("submit", "-", "-l", "modle=Pixel Test", "-o", "json", stdin=TAP)
    assert run.code == 0, run.err
    assert run.err == "amc: warning: no device has label 'modle'; did you mean 'model'?\n"
    assert await farm.status(run.json()["task_id"]) == "queued"


async def test_a_misspelt_label_value_or_serial_is_warned_of_with_the_nearest(
    amc: Cli, farm: Farm
) -> None:
    """A value no device has, and a serial no device has, each get their line."""
    await farm.host("h1", "pixel-1", "tablet-2")
    run = await amc("submit", "-", "-l", "model=pixel tset", "--serial", "pixel-3", stdin=TAP)
    assert run.code == 0, run.err
    assert run.err.splitlines() == [
        "amc: warning: no device has serial 'pixel-3'; did you mean 'pixel-1'?",
        "amc: warning: no device has model='pixel tset'; did you mean 'Pixel Test'?",
    ]
    assert run.out.startswith("submitted task ")


async def test_a_selector_a_device_fits_gets_no_warning(amc: Cli, farm: Farm) -> None:
    """Host labels count, as they do for matching: no warning, nothing on stderr."""
    await farm.host("h1", "s1", rack="a1")
    run = await amc("submit", "-", "-l", "rack=a1", "-l", "sdk=34", "--serial", "s1", stdin=TAP)
    assert (run.code, run.err) == (0, "")


async def test_labels_on_different_devices_but_none_with_all_are_warned_of(
    amc: Cli, farm: Farm
) -> None:
    """rack=a1 is on one phone, rack=b2's host another: no one device has both."""
    await farm.host("h1", "s1", rack="a1")
    await farm.host("h2", "s2", row="7")
    run = await amc("submit", "-", "-l", "rack=a1", "-l", "row=7", stdin=TAP)
    assert run.code == 0
    assert run.err == (
        "amc: warning: no one device has all of rack=a1 row=7 (each is on some device)\n"
    )


async def test_strict_refuses_the_selector_in_one_line_and_queues_nothing(
    amc: Cli, farm: Farm
) -> None:
    """--strict: exit 2, one error line with every problem, no task."""
    await farm.host("h1", "s1")
    run = await amc("submit", "-", "--strict", "-l", "modle=x", "-l", "sdk=43", stdin=TAP)
    assert run.code == 2
    assert run.assert_one_error_line() == (
        "amc: error: no device has label 'modle'; did you mean 'model'?; no device has "
        "sdk='43' (there are: 34) (--strict: nothing submitted)"
    )
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0
    ok = await amc("submit", "-", "--strict", "-l", "sdk=34", stdin=TAP)
    assert (ok.code, ok.err) == (0, "")


async def test_a_client_token_submits_unchecked_and_strict_says_it_cannot_check(
    amc: Cli, farm: Farm
) -> None:
    """A client may not list hosts: no warning (and no noise) without --strict; with it,
    exit 6 saying why the selector could not be checked."""
    await farm.host("h1", "s1")
    client = await farm.token(Role.CLIENT)
    run = await amc("submit", "-", "-l", "modle=x", token=client, stdin=TAP)
    assert (run.code, run.err) == (0, "")
    strict = await amc("submit", "-", "--strict", "-l", "modle=x", token=client, stdin=TAP)
    assert strict.code == 6
    line = strict.assert_one_error_line()
    assert line.startswith("amc: error: --strict: cannot check the selector: list hosts:"), line
    assert "PERMISSION_DENIED" in line


def test_no_device_registered_and_no_near_name_are_said_plainly() -> None:
    """No device at all: one sentence. A key nothing is near: the keys there are."""
    selector = task_pb2.DeviceSelector(labels={"zzz": "1"})
    assert problems(selector, []) == [
        "no device is registered yet; the task waits until one that fits registers"
    ]
    device = scheduler_pb2.Device(serial="s1", labels={"model": "A", "sdk": "34"})
    host = scheduler_pb2.Host(host_id="h1", devices=[device])
    assert problems(selector, [host]) == ["no device has label 'zzz' (there are: model, sdk)"]
    assert problems(task_pb2.DeviceSelector(), [host]) == []
