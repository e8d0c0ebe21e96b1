"""The reward curve of a GRPO run, from the trainer's log history (restored on resume, so a
resumed run's curve is whole): <output_dir>/reward_curve.csv and reward_curve.png.

    python -c "from pipeline.rl.curve import plot_run; plot_run('checkpoints/x/y-grpo/react')"
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.storage import atomic_write_text

COLUMNS = ("step", "reward", "reward_std", "rewards/em/mean", "rewards/f1/mean", "rewards/format/mean",
           "rollout/finish_rate", "rollout/mean_steps", "rollout/searches", "heldout/em", "loss")
EDGE = 5  # steps averaged at each end for the manifest's first / last reward


@dataclass
class RewardCurve:
    rows: list[dict]

    def mean_reward(self, first: bool) -> float | None:
        rewards = [r["reward"] for r in self.rows if r.get("reward") is not None]
        part = rewards[:EDGE] if first else rewards[-EDGE:]
        return round(sum(part) / len(part), 4) if part else None


def reward_curve(log_history: list[dict]) -> RewardCurve:
    """One row per logged training step (TRL logs `reward` with the loss)."""
    rows = [{k: entry.get(k) for k in COLUMNS} for entry in log_history if "reward" in entry and "step" in entry]
    return RewardCurve(rows)


def write_curve(curve: RewardCurve, output_dir: Path) -> None:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(curve.rows)
    atomic_write_text(Path(output_dir) / "reward_curve.csv", out.getvalue())
    if curve.rows:
        plot_curve(curve, Path(output_dir) / "reward_curve.png")


def plot_curve(curve: RewardCurve, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in curve.rows]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(steps, [r["reward"] for r in curve.rows], label="mean reward", color="C0")
    if all(r.get("rewards/em/mean") is not None for r in curve.rows):
        ax.plot(steps, [r["rewards/em/mean"] for r in curve.rows], label="EM", color="C1", alpha=0.7)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean over the step's rollouts")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_run(output_dir: str | Path) -> RewardCurve:
    """Redraw a run's curve from its latest trainer_state.json (e.g. of a checkpoint mid-run)."""
    from pipeline.train.checkpoints import list_checkpoints

    output_dir = Path(output_dir)
    states = [p / "trainer_state.json" for p in list_checkpoints(output_dir) if (p / "trainer_state.json").is_file()]
    if not states:
        from pipeline.core.errors import PipelineError

        raise PipelineError(f"{output_dir}: no checkpoint with a trainer_state.json yet")
    curve = reward_curve(json.loads(states[-1].read_text(encoding="utf-8"))["log_history"])
    write_curve(curve, output_dir)
    return curve
