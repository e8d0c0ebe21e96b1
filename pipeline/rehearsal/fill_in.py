"""The rehearsal's labelled fill-in: correct trajectories where a tiny random teacher writes none.

A random model's episodes are noise (no finish, no answer), so `filter` would make empty SFT sets
and every training unit would have nothing to train on. Before the filter unit runs, the oracle
stand-in teacher (pipeline/agent/answerers.py: it reads the gold supporting facts, asks no model)
answers the same questions in each format into <out_dir>/fill-in, and that folder is added to the
filter's inputs: its trajectories are correct and grounded in the environment, its teacher is
named `oracle` in every row and manifest, and the plan says so. It acts in the environment's
clean observation style whatever the grid's (in the original style its `Search[...]` is an
invalid action: it finishes nothing).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

from pipeline.core.config import to_dict
from pipeline.core.errors import PipelineError

ORACLE = {"hotpotqa": "agent", "fever": "exact"}  # the stand-in's style for each task
FOLDER = "fill-in"


def note(task: str, questions: int) -> str:
    return (f"filter: a random teacher writes no correct trajectory, so the oracle stand-in (gold facts, no model; "
            f"oracle: {ORACLE.get(task, 'exact')}) answers the same {questions} questions into <out_dir>/{FOLDER}, "
            "added to the filter's inputs (labelled: its teacher is `oracle`; clean observation style)")


def filling(action, generate_config):
    """The filter unit's action, run once the fill-in folder is there, with it among its inputs."""
    def run_unit(config):
        folder = Path(config.out_dir).parent / FOLDER
        layers = {k: v for k, v in to_dict(generate_config).items() if k not in ("teacher", "serve", "out_dir")}
        layers["wiki"] = {**layers["wiki"], "observation_style": "clean"}  # the stand-in acts in the clean style only
        layers |= {"oracle": ORACLE.get(generate_config.task, "exact"), "out_dir": str(folder)}
        print(f"[rehearsal] fill-in: the oracle stand-in answers the teacher's questions into {folder}", flush=True)
        generate_in_child(layers, folder)
        return action(replace(config, inputs=[*config.inputs, str(folder)]))
    return run_unit


def generate_in_child(layers: dict, folder: Path) -> None:
    """`python -m pipeline generate` with these keys (only `run` calls stages in-process); its
    output and its own error line stream through."""
    with tempfile.TemporaryDirectory(prefix="rehearsal-fill-in-") as scratch:
        path = Path(scratch) / "generate.yaml"
        path.write_text(yaml.safe_dump(layers, sort_keys=False), encoding="utf-8")
        code = subprocess.run([sys.executable, "-m", "pipeline", "generate", "--config", str(path)]).returncode
    if code != 0:
        raise PipelineError(f"the rehearsal's fill-in ({folder}) failed (exit code {code}; its error is above); "
                            "fix the cause and re-run: finished units are skipped")
