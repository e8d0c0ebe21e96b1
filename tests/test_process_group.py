"""pipeline/train/script.py: a training script that finished destroys its process group, so that
no rank aborts at exit. Left to the interpreter's teardown, Gloo's worker threads made a rank
abort ("terminate called without an active exception", SIGABRT) after a complete run: the paper
rehearsal's 70B training failed so with its final model saved. Measured with two spawned Gloo
ranks (a gather, an asynchronous all-reduce, then exit), beside the test suite: 8 of 20 runs had
a rank abort without destroy_process_group, 0 of 20 with it; too slow a count for the suite (each
spawned rank imports torch), so the test here checks the script's part: no group is left.

    .venv/bin/python -m pytest tests/test_process_group.py -q
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.train.script import script_main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Settings:
    steps: int = 1


def test_a_finished_run_leaves_no_process_group():
    def run(cfg):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        dist.all_reduce(torch.ones(4))

    assert script_main([], Settings, section="x", resolve=lambda cfg: cfg, run=run, prog="t", description="t") == 0
    assert not dist.is_initialized()


ABORTS_AFTER_SAVE = """
import os, sys
from pipeline.core.storage import write_manifest
if sys.argv[1] == "saved":  # final/ complete, as write_final leaves it, then the teardown abort
    os.makedirs(sys.argv[2])
    write_manifest(os.path.join(sys.argv[2], "manifest.json"), stage="train", config={}, complete=True)
os.abort()  # SIGABRT, as "terminate called without an active exception" ends a rank
"""


def test_a_launch_that_aborts_after_its_verified_save_is_done_and_says_so(tmp_path, capsys):
    """A real process that aborts (SIGABRT) at its end, as a rank did at teardown in a suite run
    of tests/test_grpo.py::test_deepspeed_zero3_launch with its final/ saved: the stage's exit
    code was the launch's, so a finished run failed. With final/ saved complete by this launch the
    run is done, and a line says what the launch exited with; without it, or with a final/ left
    by an earlier launch, the failure stands."""
    import sys
    import time

    from pipeline.train.launcher import exit_after_save, launch

    final = tmp_path / "final"
    started = time.time()
    code = launch([sys.executable, "-c", ABORTS_AFTER_SAVE, "not saved", str(final)])
    assert code != 0 and exit_after_save(code, final, started, "train") == code
    code = launch([sys.executable, "-c", ABORTS_AFTER_SAVE, "saved", str(final)])
    assert code != 0
    capsys.readouterr()
    assert exit_after_save(code, final, started, "train") == 0
    assert f"[train] the launch exited with code {code} after this launch saved {final} complete" in capsys.readouterr().out
    later = time.time() + 1  # the same final/, left by an earlier launch than one started now
    assert exit_after_save(code, final, later, "train") == code
