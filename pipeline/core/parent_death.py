"""Child processes that end with the process that started them (Linux's PR_SET_PDEATHSIG).

`run` trains through `accelerate launch` in its own session (so that Ctrl-C reaches the launcher
and every worker) and runs each eval and generate unit in a child. A SIGKILL of `run` alone
(`kill -9 <pid>`, the kernel's OOM killer) reaches none of them: they went on training and
evaluating into the folders that the next `run` resumes. Started with
`preexec_fn=ends_with_parent()`, a child gets SIGTERM from the kernel when its parent dies, and
stops as it does on Ctrl-C or SIGTERM: accelerate's launcher and torchrun stop their workers, and
an eval stops its vLLM server. Elsewhere than Linux this is a no-op.

    subprocess.Popen(cmd, preexec_fn=ends_with_parent())
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def prctl(option: int, value: int) -> bool:
    """prctl(2) with its arguments as the unsigned longs the kernel reads; True when it took."""
    if _LIBC is None:
        return False
    return _LIBC.prctl(ctypes.c_int(option), *(ctypes.c_ulong(v) for v in (value, 0, 0, 0))) == 0


def ends_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A preexec_fn: in the child before exec, `sig` from the kernel when the parent dies. The
    kernel sends it only for a death after the prctl, so a parent that died during the fork is
    seen here, as a parent that is no longer this one, and the child gets `sig` at once."""
    parent = os.getpid()

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if _LIBC is not None and os.getppid() != parent:
            os.kill(os.getpid(), sig)
    return in_child
