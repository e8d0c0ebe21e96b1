"""EM before and after GRPO: two eval folders of one method, each EM with its 95% Wilson interval,
and the gap with Newcombe's 95% interval; the paired counts with McNemar's exact p; the GRPO run's
reward at its first and last steps.

    python scripts/grpo_report.py runs/small/eval/<the SFT student> runs/small-grpo/eval \\
        --run checkpoints/small/smollm2-135m-grpo/react

Each folder is an `eval` output (`<method>.jsonl` records; default method react); only questions
evaluated in both are compared. Prints Markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.core.errors import PipelineError, one_line_errors  # noqa: E402
from pipeline.core.storage import read_jsonl, require_complete  # noqa: E402
from pipeline.report.intervals import difference_interval, mcnemar_exact, wilson  # noqa: E402


def em_by_id(folder: Path, method: str, which: str) -> dict[str, float]:
    """The EM of each question an eval folder's `<method>.jsonl` holds; a missing folder or file,
    or a line that is not an eval record, is one line saying which."""
    if not folder.is_dir():
        raise PipelineError(f"{which}: {folder} is not a folder; give an `eval` output folder")
    path = folder / f"{method}.jsonl"
    if not path.is_file():
        held = sorted(p.stem for p in folder.glob("*.jsonl"))
        raise PipelineError(f"{which}: {path} not found; {folder} holds "
                            + (f"{', '.join(held)} (choose one with --method)" if held else "no eval records"))
    out = {}
    for i, record in enumerate(read_jsonl(path), start=1):
        if not isinstance(record, dict) or "id" not in record:
            raise PipelineError(f"{which}: {path}: record {i} has no `id`; not an eval record (docs/formats.md)")
        out[str(record["id"])] = float(record.get("em") or 0.0)
    return out


def grpo_manifest(run: Path) -> dict:
    """The GRPO run's final manifest; an ordinary fine-tuning run (stage `train`), a run not
    finished or a folder that is no run at all is refused, never reported as GRPO."""
    if not run.is_dir():
        raise PipelineError(f"--run: {run} is not a folder; give a GRPO run's output_dir (it holds final/)")
    if not (run / "final").is_dir() and (run / "manifest.json").is_file():
        raise PipelineError(f"--run: {run} is a final/ folder; give the run's output_dir, the folder above it "
                            f"({run.resolve().parent})")
    manifest = require_complete(run / "final" / "manifest.json", f"--run {run}")
    if manifest.get("stage") != "grpo" or not isinstance(manifest.get("grpo"), dict):
        raise PipelineError(f"--run: {run} is not a GRPO run (its final/manifest.json says stage "
                            f"{manifest.get('stage')!r}); give the output_dir of `python -m pipeline grpo`")
    return manifest


def logged(value) -> str:
    return "not logged" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def curve_file(run: Path) -> str:
    """The reward curve the run wrote (pipeline/rl/curve.py): its figure, else its table, else why not."""
    for name in ("reward_curve.png", "reward_curve.csv"):
        if (run / name).is_file():
            return str(run / name)
    return f"none ({run} holds no reward_curve.png or .csv)"


def percent(interval) -> str:
    return f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if interval else "[-]"


def main(argv: list[str] | None = None) -> int:
    """Exit 2 with one `error:` line for a bad input (never a traceback)."""
    return one_line_errors(lambda: report(argv))


def report(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="eval folder of the student before GRPO")
    parser.add_argument("after", type=Path, help="eval folder of the GRPO student")
    parser.add_argument("--method", default="react")
    parser.add_argument("--run", type=Path, help="the GRPO output_dir (its final/manifest.json and reward_curve.csv)")
    args = parser.parse_args(argv)
    manifest = grpo_manifest(args.run) if args.run else None  # checked before anything is printed
    before, after = em_by_id(args.before, args.method, "before"), em_by_id(args.after, args.method, "after")
    ids = sorted(set(before) & set(after))
    if not ids:
        raise PipelineError(f"no question evaluated in both {args.before} and {args.after}")
    k1, k2, n = int(sum(before[i] for i in ids)), int(sum(after[i] for i in ids)), len(ids)
    gap = difference_interval(k2, n, k1, n)
    print(f"| {args.method} EM % [95% Wilson], n={n} | before GRPO | after GRPO | after minus before [Newcombe 95%] |")
    print("|---|---:|---:|---:|")
    print(f"| | {100 * k1 / n:.1f} {percent(wilson(k1, n))} | {100 * k2 / n:.1f} {percent(wilson(k2, n))} | "
          f"{100 * (k2 - k1) / n:+.1f} {percent(gap)} |")
    both = sum(1 for i in ids if before[i] and after[i])
    only_before = sum(1 for i in ids if before[i] and not after[i])
    only_after = sum(1 for i in ids if after[i] and not before[i])
    print(f"\nPaired: {both} right in both, {only_before} only before, {only_after} only after; "
          f"McNemar's exact p = {mcnemar_exact(only_before, only_after):.3g}")
    if manifest is not None:
        grpo = manifest["grpo"]
        print(f"\nGRPO: {manifest.get('steps')} steps x {manifest.get('global_batch_size')} rollouts; mean reward "
              f"{logged(grpo.get('reward_first_steps'))} (first 5 steps) -> {logged(grpo.get('reward_last_steps'))} "
              "(last 5); "
              f"curve: {curve_file(args.run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
