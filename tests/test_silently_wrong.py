"""Inputs and runs that lost data or gave silently wrong results (issue 46, "data lost or
silently wrong"): a second training into a folder being trained, an eval prompting style that was
ignored, a filter input that dropped a method without a word, training and evaluation questions
that overlap, a task run against another task's index, and the stand-in teacher asked for a set
it cannot answer. Each case runs the real CLI (`python -m pipeline ...`) and failed before its fix.

    .venv/bin/python -m pytest tests/test_silently_wrong.py -n 0 -q
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from episode_testdata import REPO, child_env, run_pipeline
from sft_testdata import fireact_records, write_dataset

TINY = "configs/students/tiny.yaml"


def last_line(proc) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else ""


def refused(proc, pattern: str) -> None:
    """Exit 2 with one `error:` line matching `pattern` (the last line), and no traceback."""
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert last_line(proc).startswith("error: "), last_line(proc)
    assert re.search(pattern, last_line(proc)), last_line(proc)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file's bytes under `folder` but the lock's and the live run's own logs."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock" and "runs" not in p.relative_to(folder).parts}


# ------------------------------------------------------------------- 1. one training per folder


@pytest.mark.slow
def test_a_second_training_into_a_folder_being_trained_is_refused_and_touches_nothing(tmp_path):
    """A second `train` (or `run --only train`) on the folder of a running training moved the
    first's in-progress checkpoint aside as incomplete and restarted from step 0 under it."""
    runs = tmp_path / "runs"
    write_dataset(runs / "sft", "react", fireact_records(40, 1500))
    output = tmp_path / "ckpt" / "lk" / "tiny" / "react"
    args = ["train", "--config", TINY, f"dataset_dir={runs / 'sft'}", f"output_dir={output}",
            "max_steps=1000", "save_steps=2", "accelerate_config=cpu", "report_to=none"]
    first = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=child_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list(output.glob("checkpoint-*")) and time.monotonic() < deadline:
            assert first.poll() is None, "the first training stopped"
            time.sleep(1)
        assert list(output.glob("checkpoint-*")), "the first training wrote no checkpoint in 300 s"
        config = (output / "finetune_config.yaml").read_bytes()
        holder = rf"{re.escape(str(output))} is being written by another process \(pid {first.pid}\); .*output_dir$"
        refused(run_pipeline(*args, timeout=120), holder)
        grid = tmp_path / "grid.yaml"
        grid.write_text(yaml.safe_dump({
            "experiment": "lk", "out_dir": str(runs), "formats": ["react"],
            "train": {"output_root": str(tmp_path / "ckpt"), "max_steps": 1000, "save_steps": 2,
                      "accelerate_config": "cpu", "report_to": "none"},
            "students": [{"name": "tiny", "config": TINY, "size_class": "tiny", "params_b": 0.003}]}))
        refused(run_pipeline("run", "--config", str(grid), "--only", "train", timeout=120),
                r"training tiny on react: " + holder)
        assert first.poll() is None, "the first training died"
        assert (output / "finetune_config.yaml").read_bytes() == config
        assert not list(output.glob("incomplete-checkpoint-*")), "a checkpoint of the first was set aside"
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(60)
