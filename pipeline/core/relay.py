"""Copying a child process's output as it comes, for the stages that run one (`train` its
`accelerate launch`, `run` each eval).

A piece ends at a newline or a carriage return: progress bars (tqdm) redraw their line with
\\r, so a redraw is passed on as a redraw and never becomes a line of its own, as reading the
pipe with universal newlines would make it (a log line per redraw).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator


def pieces(fd: int) -> Iterator[bytes]:
    """The output read from `fd` until it closes, in pieces that end at \\n or \\r (the last
    one may end at neither), each complete as soon as its end has arrived."""
    pending = b""
    while chunk := os.read(fd, 65536):
        *complete, pending = re.split(rb"(?<=[\r\n])", pending + chunk)
        yield from complete
    if pending:
        yield pending
