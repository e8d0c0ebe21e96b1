"""scripts/sweep_report.py: the learning-rate sweep's held-out (progressive-validation) loss and EM,
read from the Trainer's trainer_state.json and eval's summary.json as those stages write them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "scripts" / "sweep_report.py")


def write_student(root: Path, name: str, lr: float, losses: list[float], em: float | None) -> None:
    train = root / "ck" / name / "cot"
    for step in (2, len(losses)):  # an older checkpoint too: the last one is read
        (train / f"checkpoint-{step}").mkdir(parents=True)
        history = [{"step": i + 1, "loss": loss, "learning_rate": lr * (i + 1) / len(losses)}
                   for i, loss in enumerate(losses[:step])]
        (train / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"global_step": step, "log_history": [*history, {"step": step, "train_loss": 9.9}]}))
    if em is not None:
        (root / "run" / "eval" / f"{name}-ft-cot").mkdir(parents=True)
        (root / "run" / "eval" / f"{name}-ft-cot" / "summary.json").write_text(json.dumps([{"em": em, "n": 50}]))


def test_sweep_report_picks_the_lowest_second_half_loss(tmp_path):
    write_student(tmp_path, "lr-1e-4", 1e-4, [3.0, 2.0, 1.5, 1.4], 0.06)
    write_student(tmp_path, "lr-3e-4", 3e-4, [3.0, 1.0, 1.6, 1.6], None)
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "run"), str(tmp_path / "ck")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # second half = steps 3 and 4: (1.5 + 1.4) / 2 and (1.6 + 1.6) / 2; the step-2 dip of lr-3e-4 does not count
    assert "| lr-1e-4 (cot) | 0.0001 | 4 | 3.000 | 1.450 | 6.0 [2.1, 16.2] (n=50) |" in lines
    assert "| lr-3e-4 (cot) | 0.0003 | 4 | 3.000 | 1.600 | (not evaluated) |" in lines
    assert lines[-1] == "Lowest held-out loss: lr-1e-4 (peak learning rate 0.0001)."
    best = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "run"), str(tmp_path / "ck"), "--best"],
                          capture_output=True, text=True, timeout=60)
    assert best.returncode == 0 and best.stdout == "0.0001\n", best


def test_sweep_report_without_checkpoints_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path), str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: no checkpoints"), proc.stderr
