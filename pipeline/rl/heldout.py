"""A held-out EM curve during GRPO: every `heldout.every` steps the policy answers a fixed small
question set greedily, as `eval` decodes a fine-tuned student, so a run that peaks and then
collapses shows it while it runs (a re-examination of Search-R1 reports exactly that).

    heldout: {every: 10, questions: offline-eval, limit: 50}     # in a grpo config

Each point (step, EM, F1, finished share, searches per episode) is a line of
<output_dir>/heldout.jsonl (a step re-run after a resume replaces its line), drawn in
heldout_curve.png, and logged with the step's metrics (`heldout/em`, ...). Step 0 is the start.
The set is for watching, not choosing: the run's number is its final policy's `eval`; with the
default questions (the first 50 of offline-eval) the curve's questions are among the final eval's.
Every process takes its share of the questions inside TRL's unwrap_model_for_generation (under
ZeRO-3 the policy is gathered once for the whole set) and the results are gathered to rank 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.config import at_least
from pipeline.core.storage import atomic_write_text

FILE, FIGURE = "heldout.jsonl", "heldout_curve.png"


@dataclass
class HeldoutSettings:
    """The held-out curve: off unless `every` is set."""

    every: int = at_least(0, default=0)  # optimizer steps between points; 0 = no held-out curve
    questions: str = "offline-eval"  # a set of the task's (or a file), apart from the training questions
    limit: int = at_least(1, default=50)  # the first N questions: a few minutes of greedy episodes per point on a CPU


def heldout_point(trainer: Any, questions: list, method, backend, max_batch_size: int, step: int,
                  sample_dtype: str = "fp32") -> dict:
    """The policy's greedy episodes on `questions`, this process's share, gathered: one point.
    All of the share is in flight at once: each round's requests go to the decoder together
    (sorted by length there, `max_batch_size` rows per decoding batch)."""
    from accelerate.utils import gather_object

    from pipeline.agent.scheduler import run_episodes
    from pipeline.agent.search_stats import search_stats
    from pipeline.llm.hf import TransformersLLM
    from pipeline.rl.policy import transformers_policy

    accelerator = trainer.accelerator
    mine = questions[accelerator.process_index::accelerator.num_processes]
    with transformers_policy(trainer, max_batch_size, None, llm_class=TransformersLLM, sample_dtype=sample_dtype) as llm:
        records = run_episodes(llm, lambda: backend, mine, method, max_in_flight=max(1, len(mine)),
                               teacher="policy", source="grpo-heldout")
    records = gather_object([{k: r[k] for k in ("em", "f1", "finished", "steps")} for r in records])
    n = len(records)
    return {"step": step, "n": n, "em": sum(r["em"] for r in records) / n, "f1": sum(r["f1"] for r in records) / n,
            "finished": sum(r["finished"] for r in records) / n, "searches": search_stats(records)["searches"] / n}


def heldout_callback(trainer: Any, settings: HeldoutSettings, questions: list, method, backend,
                     max_batch_size: int, output_dir: Path, sample_dtype: str = "fp32"):
    """A TrainerCallback that adds a point at step 0 and every `settings.every` steps;
    `method` is the loop built greedy (temperature 0), as `eval` runs it."""
    from transformers import TrainerCallback

    class Heldout(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                self.point(state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % settings.every == 0:
                point = self.point(state.global_step)
                for key in ("em", "f1", "finished", "searches"):  # logged with this step's own metrics
                    trainer._metrics["train"][f"heldout/{key}"].append(point[key])

        def point(self, step: int) -> dict:
            point = heldout_point(trainer, questions, method, backend, max_batch_size, step, sample_dtype)
            if trainer.accelerator.is_main_process:
                write_point(output_dir, point)
                print(f"[grpo] held-out at step {step}: EM {100 * point['em']:.1f}% of {point['n']}, "
                      f"{point['searches']:.2f} searches per episode")
            return point

    return Heldout()


def read_points(output_dir: Path) -> list[dict]:
    path = Path(output_dir) / FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_point(output_dir: Path, point: dict) -> None:
    """Add (or, for a step re-run after a resume, replace) a point; redraw the curve."""
    points = sorted([p for p in read_points(output_dir) if p["step"] != point["step"]] + [point],
                    key=lambda p: p["step"])
    atomic_write_text(Path(output_dir) / FILE, "".join(json.dumps(p) + "\n" for p in points))
    plot_points(points, Path(output_dir) / FIGURE)


def plot_points(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in points]
    fig, (em, searches) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=120)
    em.plot(steps, [100 * p["em"] for p in points], marker="o", label="EM")
    em.plot(steps, [100 * p["f1"] for p in points], marker=".", alpha=0.7, label="F1")
    em.set_ylabel(f"held-out % ({points[-1]['n']} questions, greedy)")
    searches.plot(steps, [p["searches"] for p in points], marker="o", color="C2")
    searches.set_ylabel("searches per episode")
    for ax in (em, searches):
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    em.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
