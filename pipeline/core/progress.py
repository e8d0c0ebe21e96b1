"""Progress bars on a terminal, periodic lines in a log file.

tqdm (ours: episodes, downloads, the index build; the Trainer's steps; transformers' weight
loading) redraws its bar with \\r. In a file (a SLURM job's log, `> run.log 2>&1`) every redraw is
kept: one line of thousands of \\r-separated frames that `less`, `grep` and `tail` show as one line,
and a refresh every few hundred milliseconds. So where the output is not a terminal each process
of the pipeline wraps its stderr in `RedrawsAsLines`: a bar's state becomes a line of its own at
most every `REACT_PIPELINE_PROGRESS_EVERY_S` seconds (default 30), plus its last state when it
closes; every other line passes through unchanged.

The first pipeline process decides, from its own stdout and stderr, and writes the choice to
`REACT_PIPELINE_PROGRESS` (bars | lines) for its children: a launched training child or an eval
child writes into a pipe its parent relays (pipeline/core/relay.py), which is no terminal even
when the parent's output is one.
"""

from __future__ import annotations

import io
import math
import os
import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

from pipeline.core.errors import PipelineError

STYLE_ENV = "REACT_PIPELINE_PROGRESS"  # bars | lines
EVERY_ENV = "REACT_PIPELINE_PROGRESS_EVERY_S"
STYLES = ("bars", "lines")
DEFAULT_EVERY_S = 30.0
_REDRAW_OR_END = re.compile(r"(\r|\n)")
_CURSOR_MOVES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # tqdm's moves between nested bars


class RedrawsAsLines(io.TextIOBase):
    """A text stream over `stream` that writes a \\r-redrawn line (a progress bar's frame) as a
    line of its own at most every `every_s` seconds, and each \\n-ended line as it is."""

    def __init__(self, stream: TextIO, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.stream, self.every_s, self.clock = stream, every_s, clock
        self._line = ""  # text since the last \r or \n
        self._after_redraw = False  # the last piece was a \r
        self._unshown = ""  # the last frame not written (a bar's state that "\r\n" would end)
        self._last_frame_at = -math.inf

    def write(self, text: str) -> int:
        for piece in filter(None, _REDRAW_OR_END.split(text)):
            if piece == "\r":
                self._frame(self._line)
            elif piece == "\n":
                self._end_line()
            else:
                self._line += piece
                continue
            self._line, self._after_redraw = "", piece == "\r"
        return len(text)

    def _frame(self, frame: str) -> None:
        frame = _CURSOR_MOVES.sub("", frame).strip()
        if not frame:  # a bar wiping itself (tqdm's clear before a message)
            return
        now = self.clock()
        if now - self._last_frame_at >= self.every_s:
            self._put(frame)
            self._last_frame_at = now
        else:
            self._unshown = frame

    def _end_line(self) -> None:
        line = _CURSOR_MOVES.sub("", self._line)
        if line.strip():
            self._put(line)
        elif self._after_redraw and self._unshown:  # "...\r\n": the frame was the line
            self._put(self._unshown)
        elif not line and not self._after_redraw:  # a blank line stays
            self._put("")

    def _put(self, line: str) -> None:
        self.stream.write(line + "\n")
        self._unshown = ""

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str):
        """The rest from the stream underneath: `buffer` (a child's output relayed as bytes, already
        lines: the child took the same choice), `errors`, `reconfigure`, ..."""
        if name == "stream":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.stream, name)


def progress_style() -> str:
    """bars | lines: the parent's choice when one was made, else from this process's own output."""
    style = os.environ.get(STYLE_ENV)
    if style is None:
        style = "bars" if all(_is_terminal(s) for s in (sys.stdout, sys.stderr)) else "lines"
        os.environ[STYLE_ENV] = style  # the children write into pipes: they take this choice
    if style not in STYLES:
        raise PipelineError(f"{STYLE_ENV}={style!r}: use one of {', '.join(STYLES)} (unset: bars on a terminal, "
                            "lines otherwise)")
    return style


def every_s() -> float:
    text = os.environ.get(EVERY_ENV, str(DEFAULT_EVERY_S))
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise PipelineError(f"{EVERY_ENV}={text!r}: give the seconds between progress lines, e.g. 30")
    return value


def use_lines_off_terminal() -> None:
    """Where progress goes to a file, wrap this process's stderr (tqdm's stream) in
    RedrawsAsLines; called first thing by the CLI and by each launched training script."""
    if progress_style() == "lines" and not isinstance(sys.stderr, RedrawsAsLines):
        sys.stderr = RedrawsAsLines(sys.stderr, every_s())


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
