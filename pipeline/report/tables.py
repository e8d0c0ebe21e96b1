"""The results as tables: results.csv (one line per row, ours then the references) and results.md
(per mode, one line per method, one column per model: `EM [95% Wilson interval] (n=...)`).
Methods are listed in the registry's figure order (pipeline.methods.registry)."""

from __future__ import annotations

import csv
import io

from pipeline.methods.registry import figure_rank, in_figure_order
from pipeline.report.summaries import (
    MODES,
    ORACLE_DATA_SUFFIX,
    em_gap_interval,
    em_interval,
    is_grpo,
    method_label,
    pct,
    pct_ci,
    precision_of,
)
from pipeline.tasks import Task, get_task

CSV_COLUMNS = ("source", "mode", "search", "model", "size_class", "params_b", "method", "question_set", "n",
               "em_pct", "em_lo_pct", "em_hi_pct", "f1_pct", "finish_rate", "mean_steps", "reference")


def results_csv(rows: list[dict], references: list[dict]) -> str:
    out = io.StringIO()
    # `training` (grpo) only where a row has it: a grid without GRPO keeps its columns
    columns = CSV_COLUMNS + (("training",) if any(r.get("training") for r in rows) else ())
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in [*_sorted(rows), *_sorted(references)]:
        ci = em_interval(row) or (None, None)
        writer.writerow({
            **{k: row.get(k) for k in columns},
            "em_lo_pct": None if ci[0] is None else round(100 * ci[0], 2),
            "em_hi_pct": None if ci[1] is None else round(100 * ci[1], 2),
            "source": row.get("source") or "ours",
            "search": (row.get("search") or "title") if (row.get("source") or "ours") == "ours" else None,
            "em_pct": round(100 * row["em"], 2),
            "f1_pct": None if row.get("f1") is None else round(100 * row["f1"], 2),
            "reference": row.get("reference") or row.get("note") or "",
        })
    return out.getvalue()


def results_markdown(rows: list[dict], references: list[dict], question_sets: list[str],
                     task: Task | None = None) -> str:
    task = get_task(task)
    metric = task.metric_label
    search = rows[0].get("search") or "title" if rows else "title"  # one mode per table (check_search_modes)
    lines = [f"# {task.title} {metric} (%) by model size: {', '.join(question_sets)}; {search} search", "",
             f"Each cell: {metric} [95% Wilson interval over the n questions] (n=questions).", ""]
    for mode, title in MODES.items():
        mode_rows = [r for r in rows if r["mode"] == mode]
        if not mode_rows:
            lines += [f"## {title}", "", "(no rows)", ""]
            continue
        columns = sorted({(r["params_b"], r["size_class"], r["model"]) for r in mode_rows})
        cell = {(r["params_b"], r["size_class"], r["model"], r["method"]): r for r in mode_rows}
        lines += [f"## {title}", "", "| method | " + " | ".join(f"{m} ({s})" for _, s, m in columns) + " |",
                  "|---|" + "---:|" * len(columns)]
        for spec in in_figure_order(r["method"] for r in mode_rows):
            cells = [cell.get((*c, spec.name)) for c in columns]
            lines.append(f"| {spec.label} | "
                         + " | ".join(f"{pct_ci(r)} (n={r.get('n')})" if r else "–" for r in cells) + " |")
        lines.append("")
    if references:
        lines += ["## Reference points (published, not run here)", "",
                  f"| source | model | mode | method | {metric} | reference |", "|---|---|---|---|---:|---|"]
        lines += [f"| {r['source']} | {r['model']} | {r['mode']} | {method_label(r)} | {pct(r)} | "
                  f"{r.get('reference') or r.get('note') or ''} |" for r in _sorted(references)]
        lines.append("")
    return "\n".join(lines)


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["mode"] != "prompt", r["params_b"], r["model"], figure_rank(r["method"])))


def sizes_markdown(rows: list[dict], extra: list[dict], question_sets: list[str], task: Task | None = None) -> str:
    """sizes.md, the table beside the figure with sizes on its x axis: one line per method, per size
    the prompted cell, the fine-tuned cell and the gain (fine-tuned minus prompted, with Newcombe's
    95% interval); then the GRPO and self-training points (`extra`), one line each."""
    task = get_task(task)
    metric = task.metric_label
    sizes = sorted({r["params_b"] for r in rows})
    names = {size: _models_at(rows, size) for size in sizes}
    label = {size: next(r["size_class"] for r in rows if r["params_b"] == size) for size in sizes}
    label |= {r["params_b"]: r["size_class"] for r in extra if r["params_b"] not in label}
    lines = [f"# {task.title} {metric} (%) by model size, prompted and fine-tuned: {', '.join(question_sets)}", "",
             f"Each cell: {metric} [95% Wilson interval] (n); gain: fine-tuned minus prompted at that size, "
             "[Newcombe's 95% interval]. Models: " + "; ".join(f"{label[s]} = {names[s]}" for s in sizes)
             + ". Models of different families differ in more than size.", "",
             "| method | " + " | ".join(f"{label[s]} prompted | {label[s]} fine-tuned | {label[s]} gain"
                                      for s in sizes) + " |",
             "|---|" + "---:|" * (3 * len(sizes))]
    for spec in in_figure_order(r["method"] for r in rows):
        cells = []
        for size in sizes:
            prompted, tuned = (_cell(rows, size, mode, spec.name) for mode in MODES)
            cells += [_pct_n(prompted), _pct_n(tuned), gap_text(tuned, prompted)]
        lines.append(f"| {spec.label} | " + " | ".join(cells) + " |")
    if extra:
        lines += ["", "Beyond the grid (not on the lines, not judged):", "",
                  f"| model | size | method | {metric} |", "|---|---|---|---:|"]
        lines += [f"| {r['model']} | {r['size_class']} | {method_label(r)} | {_pct_n(r)} |"
                  for r in sorted(extra, key=lambda r: (r["params_b"], r["model"]))]
    return "\n".join(lines) + "\n"


def _models_at(rows: list[dict], size: float) -> str:
    """The models at one size, the prompted ones first (their names are the base models')."""
    at = sorted({(r["mode"] != "prompt", r["model"]) for r in rows if r["params_b"] == size})
    return ", ".join(model for _, model in at)


def _cell(rows: list[dict], size: float, mode: str, method: str) -> dict | None:
    return next((r for r in rows if (r["params_b"], r["mode"], r["method"]) == (size, mode, method)), None)


def _pct_n(row: dict | None) -> str:
    return f"{pct_ci(row)} ({row.get('n')})" if row else "–"


def gap_text(a: dict | None, b: dict | None) -> str:
    """a - b in EM points with Newcombe's 95% interval (when both counts are known); – if either is missing."""
    if a is None or b is None:
        return "–"
    gap, ci = f"{100 * (a['em'] - b['em']):+.1f}", em_gap_interval(a, b)
    return gap if ci is None else f"{gap} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def exemplars_markdown(figure_rows: list[dict], other_rows: list[dict], task: Task | None = None) -> str:
    """exemplars.md: each prompted cell with another exemplar set beside figure 3's cell of the same
    model and method, and the gap (other minus figure 3's, with Newcombe's 95% interval)."""
    task = get_task(task)
    metric = task.metric_label
    lines = [f"# Prompted {task.title} {metric} (%) by exemplar set", "",
             f"Each cell: {metric} [95% Wilson interval] (n); gap: the other set minus figure 3's, "
             "[Newcombe's 95% interval]; within noise when it contains 0.", "",
             f"| model | size | method | figure 3's exemplars | {metric} | other exemplars | {metric} | gap |",
             "|---|---|---|---|---:|---|---:|---:|"]
    for other in sorted(other_rows, key=lambda r: (r["params_b"], r["model"], figure_rank(r["method"]))):
        figure = next((r for r in figure_rows if r["mode"] == "prompt"
                       and (r["model"], r["method"]) == (other["model"], other["method"])), None)
        lines.append(f"| {other['model']} | {other['size_class']} | {method_label(other)} | "
                     f"{(figure or {}).get('exemplars', '–')} | {_pct_n(figure)} | {other.get('exemplars', '?')} | "
                     f"{_pct_n(other)} | {gap_text(other, figure)} |")
    return "\n".join(lines) + "\n"


def teachers_markdown(figure_rows: list[dict], other_rows: list[dict], task: Task | None = None) -> str:
    """teachers.md: each student trained on the stand-in teacher's data (a grid's compare_oracle)
    beside the student of the same name trained on the model teacher's data (figure 3's fine-tuned
    cell of that method: not GRPO, not released), and the gap (the model teacher's minus the
    stand-in's, with Newcombe's 95% interval). Each side is named as its summary names it, with
    the precision it was trained and run in."""
    task = get_task(task)
    metric = task.metric_label
    lines = [f"# Fine-tuned {task.title} {metric} (%) by teacher: the prompted model's data against the stand-in's", "",
             f"Each cell: {metric} [95% Wilson interval] (n); the same questions and per-format rows for both "
             "(filter's match_dataset: fewer for the stand-in where it solved fewer); gap: the model teacher's "
             "data minus the stand-in's [Newcombe's 95% interval]; within noise when it contains 0.", "",
             f"| size | method | on the model teacher's data | {metric} | on the stand-in's data | {metric} | gap |",
             "|---|---|---|---:|---|---:|---:|"]
    for other in sorted(other_rows, key=lambda r: (r["params_b"], r["name"], figure_rank(r["method"]))):
        own = own_student_row(figure_rows, other)
        lines.append(f"| {other['size_class']} | {method_label(other)} | {_named(own)} | "
                     f"{_pct_n(own)} | {_named(other)} | {_pct_n(other)} | {gap_text(own, other)} |")
    return "\n".join(lines) + "\n"


def own_student_row(figure_rows: list[dict], other: dict) -> dict | None:
    """The fine-tuned row of the student that `other` (`<student>-oracle-data`) was trained beside:
    by name, so that two students of one size are never confused."""
    own_name = other["name"].replace(ORACLE_DATA_SUFFIX, "", 1)
    return next((r for r in figure_rows if r["mode"] == "finetune" and not is_grpo(r) and not r.get("released")
                 and (r["name"], r["method"]) == (own_name, other["method"])), None)


def _named(row: dict | None) -> str:
    return "–" if row is None else f"{row['name']} [{precision_of(row)}]"
