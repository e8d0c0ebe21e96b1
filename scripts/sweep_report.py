"""Report the learning-rate sweep of the evidence grid (configs/small-sweep.yaml): per student
(one learning rate each), the progressive-validation loss and the fine-tuned EM.

    python scripts/sweep_report.py runs/small-sweep checkpoints/small-sweep    # after scripts/small.sh

In a single epoch the loss logged at each step is on trajectories the model has not trained on
yet, so the mean over the second half of the epoch is a held-out loss (progressive validation);
the first half is mostly the warm-up and the drop from the base model. It reads each student's
last checkpoint's `trainer_state.json` (the Trainer's log_history, one loss per step with
logging_steps: 1) and `<run>/eval/<student>-ft-<format>/summary.json`; prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.report.intervals import rate_interval  # noqa: E402


def last_checkpoint(folder: Path) -> Path | None:
    found = [p for p in folder.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


def student_row(run: Path, train_dir: Path) -> dict | None:
    """One row for <checkpoints>/<student>/<format>/, or None when it has no checkpoint yet."""
    checkpoint = last_checkpoint(train_dir)
    if checkpoint is None:
        return None
    state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    losses = {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
    lr = max((e["learning_rate"] for e in state["log_history"] if "learning_rate" in e), default=None)
    steps = state["global_step"]
    second_half = [loss for step, loss in losses.items() if step > steps / 2]
    student, fmt = train_dir.parent.name, train_dir.name
    summary = run / "eval" / f"{student}-ft-{fmt}" / "summary.json"
    row = json.loads(summary.read_text(encoding="utf-8"))[0] if summary.exists() else None
    return {"student": student, "format": fmt, "peak_lr": lr, "steps": steps,
            "first_loss": losses.get(1), "held_out_loss": sum(second_half) / len(second_half) if second_half else None,
            "em": row and row["em"], "n": row and row["n"]}


def lowest_loss(rows: list[dict]) -> dict | None:
    """The sweep's pick: the student with the lowest held-out loss (None before any has one)."""
    return min((r for r in rows if r["held_out_loss"] is not None), key=lambda r: r["held_out_loss"], default=None)


def markdown(rows: list[dict]) -> str:
    lines = ["| student | peak learning rate | steps | loss at step 1 | held-out loss (mean, 2nd half of the epoch) "
             "| fine-tuned EM % [95% CI] |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["em"] is None:
            em = "(not evaluated)"
        else:
            lo, hi = rate_interval(r["em"], r["n"])
            em = f"{100 * r['em']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}] (n={r['n']})"
        lines.append(f"| {r['student']} ({r['format']}) | {r['peak_lr']:.2g} | {r['steps']} | {r['first_loss']:.3f} "
                     f"| {r['held_out_loss']:.3f} | {em} |")
    best = lowest_loss(rows)
    if best:
        lines += ["", f"Lowest held-out loss: {best['student']} (peak learning rate {best['peak_lr']:.2g})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the sweep's out_dir (runs/small-sweep)")
    parser.add_argument("checkpoints", type=Path, help="its checkpoints (checkpoints/small-sweep)")
    parser.add_argument("--best", action="store_true",
                        help="print only the peak learning rate with the lowest held-out loss (for scripts)")
    args = parser.parse_args(argv)
    folders = sorted(p for p in args.checkpoints.glob("*/*") if p.is_dir()) if args.checkpoints.is_dir() else []
    rows = [row for row in map(lambda f: student_row(args.run, f), folders) if row]
    if not rows:
        print(f"error: no checkpoints under {args.checkpoints}/<student>/<format>/; run "
              "`python -m pipeline run --config configs/small-sweep.yaml` first", file=sys.stderr)
        return 2
    if args.best:
        best = lowest_loss(rows)
        if best is None:
            print("error: no student has a second-half loss yet", file=sys.stderr)
            return 2
        print(f"{best['peak_lr']:g}")
        return 0
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
