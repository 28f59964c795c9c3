"""Cleaning profiles and baselines as the host agent reads them at start (issue 38, part 2):
defaults overridden by the first pool whose labels a phone has; anything malformed in the
file refused with one line naming the field, before the agent starts; and what a clean
removes, against the baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from host_agent.baselines import Baseline, Baselines
from host_agent.clean_profile import CleanProfile, ProfileError, load, parse
from host_agent.cleaning import settings_commands, to_remove
from host_agent.flags import parse as parse_flags

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "scripts" / "examples" / "clean-profile.yaml"


def test_the_example_profile_is_what_its_comments_say() -> None:
    """THEN its defaults, and its pools taking the phones whose labels they name."""
    profiles = load(EXAMPLE)
    d = profiles.defaults
    assert (d.timeout, d.uninstall, d.remove_files, d.reboot_every) == (180.0, True, True, 0)
    assert d.clear_packages == ("com.android.chrome",)
    assert d.clear_dirs == ("/sdcard/Download/",)
    assert d.settings["screen_timeout"] == "600000"  # milliseconds, as Android takes it
    pixel = profiles.for_device("R58M", {"model": "Pixel 7", "rack": "r2", "site": "lab"})
    assert (pixel.reboot_every, pixel.timeout) == (25, 300.0)
    assert pixel.baseline_packages == ("io.appium.settings", "com.example.companion")
    assert pixel.clear_packages == d.clear_packages  # not named in the pool: the default
    assert profiles.for_device("R58M", {"model": "Pixel 7", "rack": "r1"}) == d
    assert not profiles.for_device("x", {"pool": "perf"}).enabled


def test_without_a_profile_phones_are_cleaned_by_the_defaults() -> None:
    """THEN uninstall what is new, remove new files under /sdcard/ and /data/local/tmp/,
    in 3 minutes at most; nothing else."""
    assert parse({}).defaults == CleanProfile()
    assert CleanProfile().file_roots == ("/sdcard/", "/data/local/tmp/")
    assert (CleanProfile().clear_packages, CleanProfile().settings) == ((), {})


def test_a_pool_may_name_a_serial_and_overrides_settings_key_by_key() -> None:
    profiles = parse(
        {
            "defaults": {"settings": {"font_scale": 1.0, "animations": False}},
            "pools": [{"match": {"serial": "R58M"}, "settings": {"animations": 0.5}}],
        }
    )
    assert profiles.for_device("R58M", {}).settings == {"font_scale": "1", "animations": "0.5"}
    assert profiles.for_device("other", {}).settings == {"font_scale": "1", "animations": "0"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "the profile: must be a mapping"),
        ({"default": {}}, "the profile: unknown field 'default' (known: defaults, pools)"),
        ({"defaults": {"timeout": "3x"}}, "defaults.timeout: '3x' is not a duration"),
        ({"defaults": {"timeout": 0}}, "defaults.timeout: must be above 0"),
        ({"defaults": {"uninstall": "yes"}}, "defaults.uninstall: must be true or false"),
        ({"defaults": {"keep_packages": "com.a"}}, "defaults.keep_packages: must be a list"),
        (
            {"defaults": {"clear_packages": ["com.a", "not a package"]}},
            "defaults.clear_packages[1]: 'not a package' is not a package name",
        ),
        (
            {"defaults": {"file_roots": ["sdcard"]}},
            "defaults.file_roots[0]: 'sdcard' is not an absolute directory",
        ),
        ({"defaults": {"clear_dirs": ["/"]}}, "defaults.clear_dirs[0]: '/' is not an absolute"),
        ({"defaults": {"settings": {"colour": "red"}}}, "defaults.settings.colour: unknown"),
        ({"defaults": {"settings": {"font_scale": 9}}}, "defaults.settings.font_scale: must be"),
        ({"defaults": {"settings": {"locale": "English"}}}, "defaults.settings.locale: 'English'"),
        (
            {"defaults": {"settings": {"global/x": "a b"}}},
            "defaults.settings.global/x: 'a b': letters, digits",
        ),
        ({"defaults": {"commands": ["a\nb"]}}, "defaults.commands[0]: must be a shell command"),
        ({"defaults": {"reboot_every": -1}}, "defaults.reboot_every: must be a whole number"),
        ({"pools": {}}, "pools: must be a list"),
        ({"pools": [{"reboot_every": 2}]}, "pools[0].match: required"),
        ({"pools": [{"match": {}}]}, "pools[0].match: names no label"),
        (
            {"pools": [{"match": {"a": "b"}}, {"match": {"a": "c"}, "rebot_every": 1}]},
            "pools[1]: unknown field 'rebot_every'",
        ),
    ],
)
def test_a_malformed_profile_is_refused_in_one_line_naming_the_field(
    data: Any, message: str
) -> None:
    with pytest.raises(ProfileError) as refused:
        parse(data)
    assert str(refused.value).startswith(message), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("defaults: [1, 2\n", "--clean-profile: not YAML at line 2"),
        ("defaults:\n  reboot_every: often\n", "--clean-profile: defaults.reboot_every: must be"),
        (None, "--clean-profile: cannot read"),
    ],
    ids=["not-yaml", "bad-field", "missing"],
)
def test_the_agent_refuses_a_bad_profile_file_at_start_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, message: str
) -> None:
    """THEN `host-agent --clean-profile FILE` exits 2 with one line naming the flag, the
    field and what is wrong, before it connects to anything."""
    path = tmp_path / "clean.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as ended:
        parse_flags(["--insecure", "--clean-profile", str(path)], env={})
    assert ended.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"host-agent: error: {message}"), line


def test_the_agent_refuses_a_baselines_file_it_cannot_read_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "baselines.json"
    path.write_text('{"sim-0": {"packages": []}}')
    with pytest.raises(SystemExit):
        parse_flags(["--insecure", "--clean-baselines", str(path)], env={})
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"host-agent: error: --clean-baselines: {path} is not a baselines")


def test_baselines_are_kept_in_their_file_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    kept = Baseline(frozenset({"com.a"}), frozenset({"/sdcard/DCIM"}), ("/sdcard/",))
    Baselines(path).put("R58M", kept)
    assert Baselines(path).get("R58M") == kept
    assert not (tmp_path / "baselines.json.part").exists()


def test_a_clean_removes_the_top_of_what_is_new_and_everything_in_cleared_directories() -> None:
    """THEN a new directory is removed whole (not each file in it), a new file in a
    directory of the baseline alone, what the baseline had stays, and a cleared directory
    loses all it holds, the baseline's too."""
    baseline = frozenset({"/sdcard/DCIM", "/sdcard/DCIM/a.jpg", "/sdcard/Download"})
    found = {
        "/sdcard/DCIM",
        "/sdcard/DCIM/a.jpg",
        "/sdcard/DCIM/b.jpg",
        "/sdcard/Download",
        "/sdcard/Download/old.pdf",
        "/sdcard/trip",
        "/sdcard/trip/1.jpg",
        "/data/local/tmp/x.apk",
    }
    roots = ("/sdcard/", "/data/local/tmp/")
    assert to_remove(found, baseline, roots, ("/sdcard/Download/",)) == [
        "/data/local/tmp/x.apk",
        "/sdcard/DCIM/b.jpg",
        "/sdcard/Download/old.pdf",
        "/sdcard/trip",
    ]


def test_settings_are_put_with_the_commands_android_takes() -> None:
    profile = parse(
        {
            "defaults": {
                "settings": {
                    "locale": "de-DE",
                    "font_scale": 1.15,
                    "screen_timeout": "30s",
                    "airplane_mode": True,
                    "animations": False,
                    "secure/show_ime_with_hard_keyboard": 1,
                }
            }
        }
    ).defaults
    assert settings_commands(profile.settings) == [
        "settings put system system_locales de-DE",
        "settings put system font_scale 1.15",
        "settings put system screen_off_timeout 30000",
        "cmd connectivity airplane-mode enable",
        "settings put global window_animation_scale 0",
        "settings put global transition_animation_scale 0",
        "settings put global animator_duration_scale 0",
        "settings put secure show_ime_with_hard_keyboard 1",
    ]
