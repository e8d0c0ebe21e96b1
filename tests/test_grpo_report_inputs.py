"""scripts/grpo_report.py checks what it is pointed at (issue 60): a run that is not a GRPO run,
a missing eval folder, file or run, a line that is not an eval record: each one line, exit 2, no
traceback; a GRPO run's curve is named only when it exists. The script runs as a real process.

    .venv/bin/python -m pytest tests/test_grpo_report_inputs.py -n 0 -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from episode_testdata import child_env

from pipeline.core.storage import write_manifest

REPO = Path(__file__).resolve().parents[1]


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "grpo_report.py"), *map(str, args)],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)


def eval_folder(root: Path, name: str, method: str = "react", right: int = 2) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / f"{method}.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "em": float(i < right)}) + "\n"
                                                    for i in range(4)), encoding="utf-8")
    return folder


def run_folder(root: Path, stage: str, **extra) -> Path:
    """An output_dir whose final/manifest.json is `stage`'s, as pipeline/train/final.py writes it."""
    run = root / f"{stage}-run"
    (run / "final").mkdir(parents=True)
    write_manifest(run / "final" / "manifest.json", stage=stage, config={}, complete=True, steps=2,
                   global_batch_size=4, **extra)
    return run


GRPO_FIELDS = {"grpo": {"group_size": 4, "reward_first_steps": 0.25, "reward_last_steps": 0.5}}


def one_line_refusal(proc, text: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == "", (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], proc.stderr


@pytest.mark.parametrize("case, text", [
    ("a fine-tuning run", "is not a GRPO run (its final/manifest.json says stage 'train')"),
    ("no such run", "is not a folder; give a GRPO run's output_dir"),
    ("a run without final", "no manifest at"),
    ("the run's final folder", "is a final/ folder; give the run's output_dir, the folder above it"),
    ("an unfinished GRPO run", "says the run that wrote it is incomplete"),
    ("no before folder", "before: "),
    ("an after folder of another method", "(choose one with --method)"),
    ("a line that is not a record", "record 2 has no `id`"),
    ("a line that is not JSON", "after/react.jsonl:2: not valid JSON"),
])
def test_a_run_that_is_not_grpo_and_missing_inputs_are_one_line_each(tmp_path, case, text):
    """Pointed at an ordinary fine-tuning run it printed "GRPO: 2 steps x 4 rollouts; mean reward
    None" and a curve that did not exist, exit 0; missing inputs ended in tracebacks."""
    before, after = eval_folder(tmp_path, "before"), eval_folder(tmp_path, "after")
    run = run_folder(tmp_path, "grpo", **GRPO_FIELDS)
    if case == "a fine-tuning run":
        run = run_folder(tmp_path, "train", format="react")
    elif case == "no such run":
        run = tmp_path / "nowhere"
    elif case == "a run without final":
        run = tmp_path / "empty-run"
        run.mkdir()
    elif case == "the run's final folder":
        run = run / "final"
    elif case == "an unfinished GRPO run":
        write_manifest(run / "final" / "manifest.json", stage="grpo", config={}, complete=False, **GRPO_FIELDS)
    elif case == "no before folder":
        before = tmp_path / "missing"
    elif case == "an after folder of another method":
        (after / "react.jsonl").rename(after / "act.jsonl")
    elif case == "a line that is not a record":
        with open(after / "react.jsonl", "w", encoding="utf-8") as fh:
            fh.write('{"id": "q0", "em": 1}\n{"em": 1}\n')
    elif case == "a line that is not JSON":
        with open(after / "react.jsonl", "w", encoding="utf-8") as fh:
            fh.write('{"id": "q0", "em": 1}\nnot json\n{"id": "q1", "em": 0}\n')
    one_line_refusal(report(before, after, "--run", run), text)


def test_a_grpo_run_is_reported_with_the_curve_it_has(tmp_path):
    before, after = eval_folder(tmp_path, "before", right=1), eval_folder(tmp_path, "after", right=3)
    run = run_folder(tmp_path, "grpo", **GRPO_FIELDS)
    proc = report(before, after, "--run", run)
    assert proc.returncode == 0, proc.stderr
    assert f"mean reward 0.250 (first 5 steps) -> 0.500 (last 5); curve: none ({run} holds no" in proc.stdout
    (run / "reward_curve.csv").write_text("step,reward\n1,0.25\n", encoding="utf-8")
    proc = report(before, after, "--run", run)
    assert proc.returncode == 0 and f"curve: {run / 'reward_curve.csv'}" in proc.stdout, proc.stderr
