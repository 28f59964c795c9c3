"""Running the examples of README.md and docs/cli.md as written, and checking what they
print against what the documents say they print.

Two kinds of example are run, each block in one bash session (so a variable one line sets
is there for the next), against a farm the test provides (`address` stands in for
`127.0.0.1:50051`; `amc` gets it as AMC_ADDR):

- A `sh` block: its commands (a command continues over lines ending in `\\` and over an
  open quote), each followed by the `# -> …` lines that say what it prints. A command
  without such a line must exit 0; one with it may fail, as long as it prints that. `…`
  stands for anything; whitespace counts as one space; JSON output is compared in its
  one-line form (`{"a": 1, "b": [2]}`). A command ending in `&` runs in the background
  and is checked when the block is done.
- A `console` block: `$ command` lines, each followed by its whole output, compared line by
  line after what differs from run to run is made alike: ids (by order of first
  appearance, so an id used again in a later command, of this block or a later one,
  stands for the same task), times, step durations, digests, a phone log's size, and the
  widths of table rules and padding. A live follow's progress lines (a time and `queued`,
  `assigned` or `dispatched`; a step of the running task, done or running) come as fast as
  the farm moves, so one the document shows may be missing from a run, and the `waiting:`
  reason of a queued line is of its moment; every other line the run printed must be the
  document's, in its order.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

DOCUMENTED_ADDRESS = "127.0.0.1:50051"
EXPECTATION = "# -> "
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
ISO_TIME = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)")
STEP_TIME = re.compile(r"\b\d+(?:m\d\d)?\.\ds\b")
DIGEST = re.compile(r"\b[0-9a-f]{64}\b")
# A phone log's size (in `amc artifacts`, and `amc get`'s line for it): its times and the
# system's chatter differ.
LOG_SIZE = re.compile(r"(│ logcat +│ +|kept logcat, )\d+")
RULES = re.compile(r"([━─═])\1+")


def fences(path: Path, language: str) -> list[str]:
    """The contents of the fenced blocks of `language` in the Markdown file, in order."""
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    return [t.content for t in tokens if t.type == "fence" and t.info == language]


# -- sh blocks -------------------------------------------------------------------------------


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)

    @property
    def background(self) -> bool:
        return self.text.rstrip().endswith("&")


HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


def commands(block: str) -> list[Command]:
    """The block's commands with the `# -> ` lines after each (a here-document's lines are
    its command's)."""
    found: list[Command] = []
    pending = ""
    until = ""  # the end of the here-document being read
    for line in block.splitlines():
        if until:
            pending = f"{pending}\n{line}"
            if line.strip() == until:
                found.append(Command(pending))
                pending = until = ""
            continue
        if not pending and line.startswith(EXPECTATION):
            assert found, f"an expectation before any command: {line!r}"
            found[-1].expected.append(line.removeprefix(EXPECTATION))
            continue
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if line.endswith("\\") or not _complete(pending):
            continue
        if heredoc := HEREDOC.search(pending):
            until = heredoc[2]
            continue
        found.append(Command(pending))
        pending = ""
    assert not pending, f"a command never ends: {pending!r}"
    return found


def _complete(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:  # an open quote
        return False
    return True


@dataclass
class Ran:
    command: Command
    code: int
    output: str


def run_sh(
    block: str,
    *,
    cwd: Path,
    env: dict[str, str],
    address: str,
    replacements: dict[str, str] | None = None,
    prelude: str = "",
    timeout: float = 240,
) -> list[Ran]:
    """Runs the block's commands in one bash session, after `prelude`; each one's output
    and exit code. In each command, every key of `replacements` (in their order) becomes
    its value, as `127.0.0.1:50051` becomes `address`."""
    found = commands(block)
    script = ["set +e", prelude]
    for n, command in enumerate(found):
        text = command.text
        for documented, here in {DOCUMENTED_ADDRESS: address, **(replacements or {})}.items():
            text = text.replace(documented, here)
        out = cwd / f".example-{n}.out"
        if command.background:
            body = text.rstrip().removesuffix("&")
            script.append(f"{{ {body}\n}} > {out} 2>&1 &")
        else:
            script.append(f"{{ {text}\n}} > {out} 2>&1; echo $? > {cwd}/.example-{n}.rc")
    script.append("wait")
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=cwd, env=env, timeout=timeout, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()
    ran = []
    for n, command in enumerate(found):
        rc = cwd / f".example-{n}.rc"
        code = int(rc.read_text()) if rc.exists() else 0
        ran.append(Ran(command, code, (cwd / f".example-{n}.out").read_text()))
    return ran


def one_line(output: str) -> str:
    """JSON output (one value or several) in its one-line form; other text with its
    whitespace collapsed."""
    decoder, values, at = json.JSONDecoder(), [], 0
    text = output.strip()
    try:
        while at < len(text):
            value, at = decoder.raw_decode(text, at)
            values.append(json.dumps(value, ensure_ascii=False))
            while at < len(text) and text[at].isspace():
                at += 1
    except ValueError:
        return " ".join(output.split())
    return " ".join(values)


def matches(expected: str, output: str) -> bool:
    """Whether `output` shows what the `# -> ` line says, `…` standing for anything."""
    parts = [re.escape(" ".join(p.split())) for p in expected.split("…")]
    return re.search(".*?".join(parts), one_line(output), re.DOTALL) is not None


def check(ran: list[Ran]) -> list[str]:
    """What did not go as the block says, one line each."""
    problems = []
    for r in ran:
        shown = f"{r.command.text!r} printed {one_line(r.output)[:2000]!r}"
        if "Traceback" in r.output:
            problems.append(f"a traceback: {shown}")
        if not r.command.expected and r.code != 0:
            problems.append(f"exit {r.code}: {shown}")
        for line in r.command.expected:
            if not matches(line, r.output):
                problems.append(f"not {line!r}: {shown}")
    return problems


# -- console blocks --------------------------------------------------------------------------


@dataclass
class Transcript:
    command: str
    output: list[str]


def transcripts(block: str) -> list[Transcript]:
    found: list[Transcript] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            found.append(Transcript(line[2:], []))
        else:
            assert found, f"output before any command: {line!r}"
            found[-1].output.append(line)
    return found


class Alike:
    """Makes run-to-run differences alike, ids by order of first appearance."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        text = UUID.sub(lambda m: self.ids.setdefault(m[0], f"<id{len(self.ids)}>"), text)
        text = ISO_TIME.sub("<time>", text)
        text = STEP_TIME.sub("<took>", text)
        text = DIGEST.sub("<sha256>", text)
        text = LOG_SIZE.sub(r"\1<size>", text)
        text = RULES.sub(r"\1", text)
        return " ".join(text.split())


# A line of a live follow that a fast run may skip (the task moved on before it was read):
# a status, or a step of a running task (shown when its host's renewal brings it, issue 27.8).
PROGRESS = re.compile(
    r"^(<time> (queued|assigned|dispatched)\b"
    r"|step \d+/\d+ .* (running for|(ok|failed|cancelled) in) <took>)"
)


def run_console(blocks: list[str], *, cwd: Path, env: dict[str, str], address: str) -> list[str]:
    """Runs the transcripts' commands in one bash session, in order, and says where their
    output is not the documented one (nothing when it all is)."""
    documented, actual = Alike(), Alike()
    problems = []
    session = subprocess.Popen(
        ["bash"], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert session.stdin is not None and session.stdout is not None
    try:
        for n, t in enumerate(t for block in blocks for t in transcripts(block)):
            want = [line for line in map(documented, t.output) if line]
            # An id the document showed before stands for the one this run printed there.
            command = t.command.replace(DOCUMENTED_ADDRESS, address)
            for doc_id, alias in documented.ids.items():
                real = next((i for i, a in actual.ids.items() if a == alias), None)
                if real is not None:
                    command = command.replace(doc_id, real)
            marker = f"@@@ end of example {n}"
            session.stdin.write(f"{{ {command}\n}} 2>&1; echo '{marker}'\n")
            session.stdin.flush()
            got = []
            while (line := session.stdout.readline()) and line.rstrip("\n") != marker:
                if shown := actual(line.rstrip("\n")):
                    got.append(shown)
            if not _printed_as_documented(got, want):
                problems.append(f"$ {t.command}\n  documented: {want}\n  printed:    {got}")
    finally:
        session.stdin.close()
        session.wait(60)
        session.stdout.close()
    return problems


def _printed_as_documented(got: list[str], want: list[str]) -> bool:
    """`got` is `want` in order, but for progress lines of `want` a run may skip."""
    at = 0
    for line in got:
        while at < len(want) and not _same(want[at], line) and PROGRESS.match(want[at]):
            at += 1
        if at == len(want) or not _same(want[at], line):
            return False
        at += 1
    return all(PROGRESS.match(line) for line in want[at:])


def _same(documented: str, printed: str) -> bool:
    if PROGRESS.match(documented):
        documented, printed = (WAITING.sub("", line) for line in (documented, printed))
    return documented == printed


WAITING = re.compile(r" waiting: .*$")
