"""One writer per output folder: `generate`, `eval`, `train` and `grpo` hold `<folder>/.lock` while
they write. A second writer would append the same episodes twice (generate, eval) or set the
first's in-progress checkpoint aside and restart from step 0 under it (train, grpo).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import remove_stale_temps

LOCK_NAME = ".lock"


@contextlib.contextmanager
def run_lock(out_dir: Path, key: str = "out_dir") -> Iterator[None]:
    """Hold `<out_dir>/.lock` while writing, or refuse in one line naming the holder's pid and
    the config `key` to change. The OS drops the lock when the holder dies (even kill -9)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / LOCK_NAME, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise PipelineError(f"{out_dir} is being written by another process (pid {fh.read().strip() or '?'}); "
                                f"wait for it to finish or use another {key}") from None
        fh.truncate(0)
        fh.write(str(os.getpid()))
        fh.flush()
        remove_stale_temps(out_dir)  # a killed run's half-written manifest or summary
        try:
            yield
        finally:
            fh.truncate(0)  # no pid left behind: a refused run leaves the folder's bytes as they were
