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
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.core.storage import read_jsonl  # noqa: E402
from pipeline.report.intervals import difference_interval, mcnemar_exact, wilson  # noqa: E402


def em_by_id(folder: Path, method: str) -> dict[str, float]:
    return {str(r["id"]): float(r.get("em") or 0.0) for r in read_jsonl(folder / f"{method}.jsonl")}


def percent(interval) -> str:
    return f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if interval else "[-]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="eval folder of the student before GRPO")
    parser.add_argument("after", type=Path, help="eval folder of the GRPO student")
    parser.add_argument("--method", default="react")
    parser.add_argument("--run", type=Path, help="the GRPO output_dir (its final/manifest.json and reward_curve.csv)")
    args = parser.parse_args(argv)
    before, after = em_by_id(args.before, args.method), em_by_id(args.after, args.method)
    ids = sorted(set(before) & set(after))
    if not ids:
        print(f"no question evaluated in both {args.before} and {args.after}", file=sys.stderr)
        return 2
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
    if args.run:
        manifest = json.loads((args.run / "final" / "manifest.json").read_text(encoding="utf-8"))
        grpo = manifest.get("grpo") or {}
        print(f"\nGRPO: {manifest.get('steps')} steps x {manifest.get('global_batch_size')} rollouts; mean reward "
              f"{grpo.get('reward_first_steps')} (first 5 steps) -> {grpo.get('reward_last_steps')} (last 5); "
              f"curve: {args.run / 'reward_curve.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
