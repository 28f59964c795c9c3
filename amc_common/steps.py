"""How a step is named to people, in one place: numbered from 1, with its name (`step 3
(evidence)`, `step 3/5 (evidence)`), and an action's place in its step from 1.

The wire counts from 0 (StepResult.index, TaskProgress.running_index, Artifact.step_index
and action_index): that is a position, which only the presentation turns into a number.
The CLI, the host agent's error texts and the client library use these; the console's
script writes the same (`stepLabel` in control_plane/console/static/dom.js).
"""

from __future__ import annotations


def number(index: int) -> int:
    """The number people read for the step (or action) at wire position `index`."""
    return index + 1


def index_of(number_text: str) -> int | None:
    """The wire position a step number typed by a person names (`3` -> 2), or None when
    it is not a number from 1."""
    if not number_text.isdigit() or int(number_text) < 1:
        return None
    return int(number_text) - 1


def label(index: int, name: str = "", count: int = 0) -> str:
    """`step 3 (evidence)`; with the number of steps, `step 3/5 (evidence)`."""
    of = f"/{count}" if count else ""
    return f"step {number(index)}{of} ({name})" if name else f"step {number(index)}{of}"


def default_name(index: int) -> str:
    """The name of a workflow step that was given none (`step 3`)."""
    return f"step {number(index)}"
