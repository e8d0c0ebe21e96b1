"""Report the oracle-style comparison (issue 17): for each run folder (the evidence grid
configs/small.yaml with the agent-style oracle, its control configs/small-exact.yaml with the
exact-title oracle), every evaluated model's ReAct EM and search hit rate, each with a 95% Wilson
interval, read from its eval records; plus how the teacher's correct trajectories searched
(generate stats), and the gap between the fine-tuned students of the first two runs with
Newcombe's 95% interval.

    python scripts/oracle_style_report.py runs/small runs/small-exact      # after bash scripts/small.sh

It reads `<run>/eval/*/react.jsonl` (one folder per evaluated model) and
`<run>/generate/manifest.json` (whose config names the oracle style), and prints Markdown. Search hit rate = the share
of Search actions whose observation showed a page (pipeline.agent.search_stats). Its interval treats
searches as independent; searches of one episode are not quite, so read it as a little narrow.
Independent of `plot`: it needs only the record files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.agent.search_stats import ratio, search_stats  # noqa: E402
from pipeline.report.intervals import difference_interval, wilson  # noqa: E402

METHOD = "react"


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def report_rows(runs: list[Path]) -> list[dict]:
    """One row per run folder x evaluated model."""
    rows = []
    for run in runs:
        style = oracle_style(run / "generate" / "manifest.json") or run.name
        teacher = teacher_stats(run / "generate" / "manifest.json")
        for path in sorted((run / "eval").glob(f"*/{METHOD}.jsonl")):
            records = read_records(path)
            search = search_stats(records)
            correct = sum(float(r.get("em") or 0) == 1.0 for r in records)
            rows.append({
                "style": style, "model": path.parent.name, "n": len(records), "correct": correct,
                "em": ratio(correct, len(records)), "em_ci": wilson(correct, len(records)),
                "searches": search["searches"], "search_hits": search["search_hits"],
                "search_hit_rate": search["search_hit_rate"],
                "search_hit_ci": wilson(search["search_hits"], search["searches"]),
                "finish_rate": ratio(sum(bool(r.get("finished")) for r in records), len(records)),
                "teacher": teacher,
            })
    return rows


def oracle_style(manifest_path: Path) -> str | None:
    if not manifest_path.exists():
        return None
    config = json.loads(manifest_path.read_text(encoding="utf-8")).get("config", {})
    # generate's `oracle` key; a manifest written before it has `teacher.oracle_style`
    return config.get("oracle") or (config.get("teacher") or {}).get("oracle_style")


def teacher_stats(manifest_path: Path) -> dict | None:
    """The generate stage's search stats over the teacher's correct ReAct trajectories."""
    if not manifest_path.exists():
        return None
    stats = json.loads(manifest_path.read_text(encoding="utf-8")).get("stats", {}).get(METHOD, {})
    return stats.get("search_correct")


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def with_interval(value: float | None, ci: tuple[float, float] | None) -> str:
    return "-" if value is None or ci is None else f"{pct(value)} [{pct(ci[0])}, {pct(ci[1])}]"


def markdown(rows: list[dict]) -> str:
    lines = ["| style | model | teacher: episodes missed / recovered / looked up % | n | finished % "
             "| EM % [95% CI] | searches | search hit % [95% CI] |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["teacher"]
        teacher = "-" if not t else f"{pct(t['miss_rate'])} / {pct(t['recover_rate'])} / {pct(t['lookup_rate'])}"
        lines.append(f"| {r['style']} | {r['model']} | {teacher} | {r['n']} | {pct(r['finish_rate'])} "
                     f"| {with_interval(r['em'], r['em_ci'])} | {r['searches']} "
                     f"| {with_interval(r['search_hit_rate'], r['search_hit_ci'])} |")
    return "\n".join(lines)


def gaps(rows: list[dict]) -> str:
    """The fine-tuned students of the first two styles: EM and search-hit gaps with Newcombe's interval."""
    tuned = [r for r in rows if "-ft-" in r["model"]]
    if len(tuned) < 2:
        return ""
    a, b = tuned[0], tuned[1]
    lines = [f"Fine-tuned on {a['style']} minus fine-tuned on {b['style']} (95% interval, Newcombe):"]
    for name, k1, n1, k2, n2 in (("EM", a["correct"], a["n"], b["correct"], b["n"]),
                                 ("search hit rate", a["search_hits"], a["searches"], b["search_hits"], b["searches"])):
        ci = difference_interval(k1, n1, k2, n2)
        if ci is None:
            lines.append(f"- {name}: no data")
            continue
        verdict = "within noise" if ci[0] <= 0 <= ci[1] else "beyond noise"
        lines.append(f"- {name}: {pct(k1 / n1 - k2 / n2)} points [{pct(ci[0])}, {pct(ci[1])}]: {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+",
                        help="run folders (a run's out_dir), e.g. runs/small runs/small-exact")
    args = parser.parse_args(argv)
    missing = [str(run) for run in args.runs if not run.is_dir()]
    if missing:
        print(f"error: {', '.join(missing)}: not a folder; run `bash scripts/small.sh` first", file=sys.stderr)
        return 2
    rows = report_rows(args.runs)
    if not rows:
        print(f"error: no <run>/eval/*/{METHOD}.jsonl found under {', '.join(map(str, args.runs))}; "
              "has the eval run?", file=sys.stderr)
        return 2
    print(markdown(rows))
    text = gaps(rows)
    if text:
        print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
