"""The self-training rounds as a table and a small figure (pipeline/rounds.py): per student and
format, one row per round with what its teacher solved on the bootstrap questions (solved, for the
first time, failed by why), what its student trained on, and that student's EM on the eval set
with its 95% Wilson interval and the gaps to round 1 and to the round before (Newcombe's 95%
interval; within noise when it contains 0). `run` writes it into <out_dir>/plot/ beside figure 3:
rounds.md, rounds.csv, rounds.json, rounds.png and rounds.svg. A round not run yet is a row of
dashes, so the report can be drawn at any point of the grid.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.storage import (
    atomic_write_json,
    atomic_write_text,
    check_writable_dir,
    read_json,
    read_manifest,
)
from pipeline.report.intervals import difference_interval, rate_interval
from pipeline.tasks import get_task, task_of

FAILED_WHY = ("error", "unfinished", "incorrect", "low_f1")  # pipeline.stages.filter FAILED_REASONS


@dataclass
class RoundsReport:
    out_dir: str = "runs/plot"
    # one entry per student and format (pipeline.rounds.report_line): student, format, prompted
    # (its prompted eval's summary.json or null), rounds: [{round, generate, dataset, summary}]
    lines: list[dict] = field(default_factory=list)


def write_rounds_report(cfg: RoundsReport) -> dict[str, Path]:
    """Read every round's outputs, write the table, CSV, JSON and figure; return their paths."""
    check_writable_dir(cfg.out_dir)
    lines = [read_line(line) for line in cfg.lines]
    task = get_task(next((r["task"] for line in lines for r in line["rounds"] if r.get("task")), None))
    out = Path(cfg.out_dir)
    paths = {"rounds_md": out / "rounds.md", "rounds_csv": out / "rounds.csv", "rounds_json": out / "rounds.json",
             "rounds_png": out / "rounds.png", "rounds_svg": out / "rounds.svg"}
    text = rounds_markdown(lines, task)
    atomic_write_text(paths["rounds_md"], text)
    atomic_write_text(paths["rounds_csv"], rounds_csv(lines))
    atomic_write_json(paths["rounds_json"], lines)
    draw_rounds(lines, task, paths["rounds_png"], paths["rounds_svg"])
    print(text)
    print(f"rounds: {paths['rounds_md']}, {paths['rounds_csv']}, {paths['rounds_png']}")
    return paths


def read_line(line: dict) -> dict:
    """One lineage's rounds, each with its generation, dataset and eval facts (None where not run yet)."""
    rows = [read_round(r, line["format"]) for r in line["rounds"]]
    for row in rows:
        row["vs_first"] = gap(row, rows[0])
        before = [r for r in rows if r["round"] == row["round"] - 1]
        row["vs_before"] = gap(row, before[0]) if before else None
    prompted = summary_row(line.get("prompted"), line["format"])
    return {"student": line["student"], "format": line["format"], "rounds": rows,
            "prompted": {k: prompted.get(k) for k in ("em", "n", "ci")} if prompted else None}


def read_round(r: dict, fmt: str) -> dict:
    row = {"round": r["round"], "teacher": None, "questions": None, "samples": None, "episodes": None,
           "solved": None, "first_solved": None, "failed": None, "training_rows": None, "new_rows": None,
           "em": None, "n": None, "ci": None, "task": None}
    manifest = read_manifest(Path(r["generate"]) / "manifest.json")
    if manifest and manifest.get("complete"):
        stats = (manifest.get("stats") or {}).get(fmt) or {}
        row.update(teacher=manifest.get("teacher"), questions=stats.get("questions"), samples=stats.get("samples"),
                   episodes=stats.get("n"), solved=stats.get("solved"),
                   first_solved=stats.get("first_solved", stats.get("solved") if r["round"] == 1 else None))
    dataset = Path(r["dataset"]) / "stats.json"
    if dataset.is_file():
        stats = read_json(dataset)
        union = stats.get("union") or {}
        row.update(failed=stats.get("failed"), training_rows=stats.get("kept"),
                   new_rows=union.get("new_rows", stats.get("kept")))
    summary = summary_row(r.get("summary"), fmt)
    if summary:
        row.update(em=summary["em"], n=summary["n"], ci=summary["ci"], task=task_of(summary))
    return row


def summary_row(path: str | None, fmt: str) -> dict | None:
    """The `fmt` row of an eval's summary.json (complete by its manifest), with its Wilson interval."""
    if not path or not Path(path).is_file():
        return None
    manifest = read_manifest(Path(path).parent / "manifest.json")
    if manifest is not None and not manifest.get("complete"):
        return None
    row = next((r for r in read_json(path) if r.get("method") == fmt), None)
    if row is None:
        return None
    return {**row, "ci": rate_interval(row["em"], row["n"])}


def gap(row: dict, other: dict) -> dict | None:
    """row's EM minus other's, with Newcombe's 95% interval (fractions); None unless both ran."""
    if row is other or row["n"] is None or other["n"] is None:
        return None
    k1, k2 = round(row["em"] * row["n"]), round(other["em"] * other["n"])
    low, high = difference_interval(k1, row["n"], k2, other["n"])
    return {"gap": row["em"] - other["em"], "low": low, "high": high}


# ---------------------------------------------------------------- the table


def rounds_markdown(lines: list[dict], task) -> str:
    metric = task.metric_label
    out = [f"# Self-training rounds: {task.title} {metric} (%) by round", "",
           "Round 1: the grid's own teacher and students; round k >= 2: round k-1's student is the teacher "
           "(pipeline/rounds.py). Questions solved: bootstrap questions at least one of the round's episodes "
           "answered correctly; first time: solved by no earlier round's teacher. Failed episodes: filter's "
           "failed.jsonl by why. "
           f"{metric}: the round's student on the eval set [95% Wilson interval] (n); gaps in points "
           "[Newcombe 95% interval], within noise when it contains 0.", ""]
    for line in lines:
        out += [f"## {line['student']}, {line['format']}", "",
                f"| round | teacher | questions x episodes each | questions solved | first time | failed episodes "
                f"| training rows (new) | {metric} % [95% CI] (n) | vs round 1 | vs the round before |",
                "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|"]
        if line["prompted"]:
            out.append(f"| prompted | – | – | – | – | – | – | {cell(line['prompted'])} | – | – |")
        for row in line["rounds"]:
            asked = "–" if row["questions"] is None else f"{row['questions']} x {row['samples'] or 1}"
            rows = "–" if row["training_rows"] is None else f"{row['training_rows']} ({row['new_rows']})"
            out.append(f"| {row['round']} | {row['teacher'] or '–'} | {asked} | {dash(row['solved'])} | "
                       f"{dash(row['first_solved'])} | {failed_text(row['failed'])} | {rows} | {cell(row)} | "
                       f"{gap_text(row['vs_first'])} | {gap_text(row['vs_before'])} |")
        out.append("")
    return "\n".join(out)


def dash(value) -> str:
    return "–" if value is None else str(value)


def cell(row: dict) -> str:
    if row.get("n") is None:
        return "–"
    ci = row["ci"]
    return f"{100 * row['em']:.1f} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}] ({row['n']})"


def failed_text(failed: dict | None) -> str:
    if failed is None:
        return "–"
    return ", ".join(f"{why} {failed[why]}" for why in FAILED_WHY if failed.get(why)) or "none"


def gap_text(g: dict | None) -> str:
    if g is None:
        return "–"
    return f"{100 * g['gap']:+.1f} [{100 * g['low']:+.1f}, {100 * g['high']:+.1f}]"


CSV_COLUMNS = ("student", "format", "round", "teacher", "questions", "samples", "episodes", "solved", "first_solved",
               *(f"failed_{why}" for why in FAILED_WHY), "training_rows", "new_rows", "n", "em_pct", "em_lo_pct",
               "em_hi_pct", "vs_round1_pct", "vs_round1_lo_pct", "vs_round1_hi_pct")


def rounds_csv(lines: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for line in lines:
        for row in line["rounds"]:
            failed, ci, first = row["failed"] or {}, row["ci"] or (None, None), row["vs_first"] or {}
            writer.writerow({**row, "student": line["student"], "format": line["format"],
                             **{f"failed_{why}": failed.get(why, 0) if row["failed"] is not None else None
                                for why in FAILED_WHY},
                             "em_pct": percent(row["em"]), "em_lo_pct": percent(ci[0]), "em_hi_pct": percent(ci[1]),
                             "vs_round1_pct": percent(first.get("gap")), "vs_round1_lo_pct": percent(first.get("low")),
                             "vs_round1_hi_pct": percent(first.get("high"))})
    return out.getvalue()


def percent(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 2)


# ---------------------------------------------------------------- the figure


def draw_rounds(lines: list[dict], task, png: Path, svg: Path) -> None:
    """EM by round, one line per student and format with Wilson error bars; the prompted model
    dashed in the same colour. matplotlib (Agg) is imported only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.report.figure import save_figure

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    rounds = sorted({r["round"] for line in lines for r in line["rounds"]})
    for i, line in enumerate(lines):
        colour = f"C{i}"
        ran = [r for r in line["rounds"] if r["n"] is not None]
        if ran:
            ys = [100 * r["em"] for r in ran]
            bars = [[y - 100 * r["ci"][0] for y, r in zip(ys, ran, strict=True)],
                    [100 * r["ci"][1] - y for y, r in zip(ys, ran, strict=True)]]
            ax.errorbar([r["round"] for r in ran], ys, yerr=bars, marker="o", capsize=3, color=colour,
                        label=f"{line['student']}, {line['format']}: fine-tuned")
        if line["prompted"]:
            ax.axhline(100 * line["prompted"]["em"], color=colour, linestyle="--", linewidth=1,
                       label=f"{line['student']}, {line['format']}: prompted")
    ax.set_xticks(rounds)
    ax.set_xlabel("self-training round (1: the grid's teacher)")
    ax.set_ylabel(f"{task.title} {task.metric_label} (%)")
    ax.set_ylim(bottom=-1.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    ax.set_title("Self-training rounds (95% Wilson intervals)", fontsize=10)
    fig.tight_layout()
    try:
        save_figure(fig, png, "png")
        save_figure(fig, svg, "svg")
    finally:
        plt.close(fig)
