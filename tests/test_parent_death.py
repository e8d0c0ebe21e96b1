"""pipeline/core/parent_death.py: a child started with `preexec_fn=ends_with_parent()` gets
SIGTERM from the kernel when its parent is SIGKILLed; without it, the child lives on (the case
that left `run`'s trainings and evals going after a `kill -9` of `run`). Real processes.

    .venv/bin/python -m pytest tests/test_parent_death.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipeline.core.parent_death import ends_with_parent

REPO = Path(__file__).resolve().parents[1]
# The child: says it is ready once its SIGTERM handler is in place, and writes TERM when it gets one.
CHILD = """import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def on_term(*_):
    out.write_text("TERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
out.write_text("ready")
time.sleep(120)
"""
# The parent: starts the child (with or without ends_with_parent), prints its pid, then sleeps.
PARENT = """import subprocess, sys, time
from pipeline.core.parent_death import ends_with_parent
ending = sys.argv[2] == "1"
child = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1]],
                         preexec_fn=ends_with_parent() if ending else None)
print(child.pid, flush=True)
time.sleep(120)
"""


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("ending", [True, False], ids=["ends_with_parent", "plain child"])
def test_a_child_gets_sigterm_when_its_parent_is_killed_outright(tmp_path, ending):
    out = tmp_path / "child.txt"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(out), "1" if ending else "0", CHILD],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        assert wait_for(lambda: out.is_file() and out.read_text() == "ready", 30), "the child never got ready"
        parent.kill()
        parent.wait()
        if ending:
            assert wait_for(lambda: out.read_text() == "TERM", 10), "no SIGTERM reached the child"
            assert wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, 10)
        else:  # the control: nothing reaches a plain child, it lives on
            time.sleep(2)
            assert out.read_text() == "ready" and child.is_running()
    finally:
        if child.is_running():
            child.kill()


def test_a_parent_gone_during_the_fork_is_seen_by_the_child(monkeypatch):
    """The kernel signals only deaths after the prctl: a child already re-parented when it runs
    the check (its parent died during the fork) signals itself. Run in this process with the
    prctl, getppid and kill recorded (this test process is not made to die with its parent)."""
    import pipeline.core.parent_death as parent_death

    calls = []
    monkeypatch.setattr(parent_death, "prctl", lambda option, value: calls.append(("prctl", option, value)))
    monkeypatch.setattr(os, "getppid", lambda: 1)  # re-parented to init before the prctl
    monkeypatch.setattr(os, "kill", lambda pid, sig: calls.append(("kill", pid, sig)))
    ends_with_parent(signal.SIGUSR1)()
    assert calls == [("prctl", parent_death.PR_SET_PDEATHSIG, signal.SIGUSR1), ("kill", os.getpid(), signal.SIGUSR1)]
