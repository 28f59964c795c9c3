"""README.md as a CommonMark renderer shows it: its sections are headings, its code blocks
hold code, and the tour's task runs long enough for a person to cancel it by hand."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

from amc_cli.specfile import load_request

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# The sections a reader (and the links of docs/) expect, as (level, text).
HEADINGS = [
    (1, "Agentic Mobile Control"),
    (2, "Quick start"),
    (2, "A five-minute tour"),
    (3, "grpcurl (reflection is on)"),
    (3, "The amc CLI"),
    (3, "From another Python service"),
    (3, "An agent's loop: a phone of its own"),
    (2, "Concepts"),
    (2, "Configuration"),
    (3, "Control plane (control-plane [serve])"),
    (3, "Host agent (host-agent)"),
    (2, "When something is wrong"),
    (2, "Repository layout"),
]
FENCE_LANGUAGES = {"", "sh", "console", "text", "python", "yaml", "json", "ini"}
# Long enough to type the watch and cancel commands after submitting.
HUMAN_SECONDS = 55


@cache
def tokens() -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(README.read_text())


def headings() -> list[tuple[int, str]]:
    found = []
    stream = tokens()
    for i, token in enumerate(stream):
        if token.type == "heading_open":
            inline = stream[i + 1]
            text = "".join(child.content for child in inline.children or [])
            found.append((int(token.tag[1]), text))
    return found


def fences() -> list[Token]:
    return [t for t in tokens() if t.type == "fence"]


def tour_block(marker: str) -> str:
    """The tour's shell block that contains `marker`."""
    (block,) = [f.content for f in fences() if f.info == "sh" and marker in f.content]
    return block


def tour_submit_body() -> dict[str, Any]:
    """The SubmitTask request the grpcurl tour sends (its `-d '…'` argument)."""
    block = tour_block("amc.v1.Scheduler/SubmitTask")
    match = re.search(r"-d '(.*?)'", block, re.DOTALL)
    assert match, "no -d '…' body in the grpcurl tour's SubmitTask"
    body: dict[str, Any] = json.loads(match.group(1))
    return body


def _seconds(duration: str) -> float:
    assert duration.endswith("s"), duration
    return float(duration[:-1])


def test_readme_sections_render_as_headings() -> None:
    """Every expected section is a heading of its level, in order."""
    found = headings()
    assert [h for h in found if h in HEADINGS] == HEADINGS, found


def test_no_code_block_swallows_a_heading() -> None:
    """No fenced block holds a Markdown heading or the title of a section."""
    titles = {text for _, text in headings()} | {text for _, text in HEADINGS}
    for fence in fences():
        for line in fence.content.splitlines():
            assert not re.match(r"#{2,6} \S", line), f"heading inside a code block: {line!r}"
            assert line.lstrip("# ").strip() not in titles, f"section inside a block: {line!r}"


def test_every_fence_is_opened_and_closed_on_a_line_of_its_own() -> None:
    """A fence line is three backticks and at most a language: text after a fence would
    make it no fence at all, and the block would run on into the next section."""
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            info = line.strip().removeprefix("```")
            assert info in FENCE_LANGUAGES, f"README.md:{number}: {line!r}"
    for fence in fences():
        assert fence.info in FENCE_LANGUAGES, fence.info


def test_the_grpcurl_tour_task_runs_long_enough_to_cancel_by_hand() -> None:
    """The submitted task waits about a minute, so CancelTask finds it running."""
    actions = tour_submit_body()["spec"]["actions"]["actions"]
    waited = sum(_seconds(a["wait"]["duration"]) for a in actions if "wait" in a)
    assert waited >= HUMAN_SECONDS, actions


def test_the_cli_tour_cancels_a_task_that_runs_long_enough() -> None:
    """The task file the CLI tour submits (and later cancels) exists and waits about a
    minute; every example file the tour names exists."""
    block = tour_block("amc cancel")
    files = re.findall(r"scripts/examples/\S+", block)
    assert files, block
    for name in files:
        assert (ROOT / name).is_file(), name
    submitted = re.search(r"^TASK=\$\(amc submit (\S+) -o json", block, re.MULTILINE)
    assert submitted, block
    assert re.search(r"^amc cancel \$TASK ", block, re.MULTILINE), block
    request = load_request(str(ROOT / submitted.group(1)))
    waits = [
        a.wait.duration.ToTimedelta() for a in request.spec.actions.actions if a.HasField("wait")
    ]
    assert sum(w.total_seconds() for w in waits) >= HUMAN_SECONDS, submitted.group(1)
