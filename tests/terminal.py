"""What a terminal (or a log viewer) shows for captured stderr with progress bars in it."""

from typing import List


def screen_lines(text: str) -> List[str]:
    """The lines ``text`` leaves on a screen: ``\\r`` returns to the start of the line and
    later characters overwrite earlier ones (as tqdm's bars redraw), ``\\n`` ends a line.
    Trailing spaces are dropped; the empty remainder after a final ``\\n`` is not a line."""
    lines = []
    for raw in text.split("\n"):
        line: List[str] = []
        for part in raw.split("\r"):
            line[: len(part)] = part
        lines.append("".join(line).rstrip())
    if lines and lines[-1] == "" and text.endswith("\n"):
        lines.pop()
    return lines
