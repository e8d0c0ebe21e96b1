"""Report the oracle-style probe (configs/oracle-probe.yaml): per style, the fine-tuned student's
EM and search hit rate, each with a 95% Wilson interval, read from its eval records; plus how the
teacher's correct trajectories searched (generate stats).

    python scripts/oracle_probe_report.py runs/oracle-probe      # after bash scripts/oracle_probe.sh

It reads `<root>/<style>/eval/*/react.jsonl` (one folder per evaluated model) and
`<root>/<style>/generate/manifest.json`, and prints a Markdown table. Search hit rate = the share
of Search actions whose observation showed a page (pipeline.search_stats). Its interval treats
searches as independent; searches of one episode are not quite, so read it as a little narrow.
Independent of `plot`: it needs only the record files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.search_stats import search_stats, wilson  # noqa: E402

METHOD = "react"


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def report_rows(root: Path) -> list[dict]:
    """One row per style folder x evaluated model under `root`."""
    rows = []
    for style_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        teacher = teacher_stats(style_dir / "generate" / "manifest.json")
        for path in sorted((style_dir / "eval").glob(f"*/{METHOD}.jsonl")):
            records = read_records(path)
            search = search_stats(records)
            correct = sum(float(r.get("em") or 0) == 1.0 for r in records)
            rows.append({
                "style": style_dir.name, "model": path.parent.name, "n": len(records),
                "em": ratio(correct, len(records)), "em_ci": wilson(correct, len(records)),
                "searches": search["searches"], "search_hit_rate": search["search_hit_rate"],
                "search_hit_ci": wilson(search["search_hits"], search["searches"]),
                "finish_rate": ratio(sum(bool(r.get("finished")) for r in records), len(records)),
                "teacher": teacher,
            })
    return rows


def teacher_stats(manifest_path: Path) -> dict | None:
    """The generate stage's search stats over the teacher's correct ReAct trajectories."""
    if not manifest_path.exists():
        return None
    stats = json.loads(manifest_path.read_text(encoding="utf-8")).get("stats", {}).get(METHOD, {})
    return stats.get("search_correct")


def ratio(k: int, n: int) -> float | None:
    return k / n if n else None


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, nargs="?", default=Path("runs/oracle-probe"),
                        help="the probe's folder: one subfolder per oracle style (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        print(f"error: {args.root} is not a folder; run `bash scripts/oracle_probe.sh` first", file=sys.stderr)
        return 2
    rows = report_rows(args.root)
    if not rows:
        print(f"error: no {args.root}/<style>/eval/*/{METHOD}.jsonl found; has the probe's eval run?",
              file=sys.stderr)
        return 2
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
