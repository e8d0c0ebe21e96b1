"""Plot: eval summaries -> the paper's figure 3 (prompting vs fine-tuning by model size), a CSV,
a Markdown table, and a check of the five orderings the paper states about that figure.

    python -m pipeline plot --config configs/demo.yaml
    python -m pipeline plot summaries=[runs/eval/demo/summary.json] out_dir=runs/plot/demo
    python -m pipeline plot summaries=[a.json,b.json] fireact_runs=[../shared/data/fireact/trajs]

Two panels (prompting, fine-tuning); x = model size in billions of parameters (log scale);
y = HotpotQA EM (%); one line per method (Standard, CoT, Act, ReAct), CoT-SC and the hybrids as
markers; each of our points carries its 95% Wilson interval over its n questions (an error bar,
and `EM [low, high]` in the table), and the orderings check calls a gap within noise when
Newcombe's 95% interval for it (built from the same two intervals) contains 0. Reference points (ReAct paper Table 1 at 540B, FireAct's Llama-2 numbers, and FireAct's
released runs when `fireact_runs` is set) are drawn hollow and labelled; they are not "our" data
and never enter the orderings check except where it says so. Rows of released checkpoints
evaluated here (`released` in the row: eval of a checkpoint trained elsewhere) are drawn as
filled plus markers labelled with their own name, apart from our students' lines, and are not judged
by the orderings check. Writes <name>.png, <name>.svg,
results.csv, results.md, orderings.md, orderings.json and manifest.json into out_dir, each by an
atomic rename.

The rows of a sharded eval (`shard=i/n`, pipeline.shards) are merged into one row per model and
method (counts summed, rates weighted by each shard's question count); an incomplete shard set
is refused.

Rows use size_class "8b", "62b", "540b" for the paper's size classes (the orderings name them);
other classes ("135m", "7b") are plotted and checked where an ordering is stated per size.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import add_config_arguments, stage_config, to_dict
from pipeline.errors import PipelineError
from pipeline.intervals import difference_interval, rate_interval
from pipeline.reference import ORDERINGS, reference_rows
from pipeline.storage import (
    atomic_path,
    atomic_write_json,
    atomic_write_text,
    check_writable_dir,
    file_fingerprint,
    read_json,
    remove_stale_temps,
    require_complete,
    write_manifest,
)

FOUR = ("standard", "cot", "act", "react")
MARKER_METHODS = ("cot_sc", "react_to_cot_sc", "cot_sc_to_react")
METHOD_LABELS = {"standard": "Standard", "cot": "CoT", "act": "Act", "react": "ReAct", "cot_sc": "CoT-SC",
                 "react_to_cot_sc": "ReAct→CoT-SC", "cot_sc_to_react": "CoT-SC→ReAct"}
COLORS = {"standard": "#7f7f7f", "cot": "#1f77b4", "act": "#ff7f0e", "react": "#d62728", "cot_sc": "#9467bd",
          "react_to_cot_sc": "#8c564b", "cot_sc_to_react": "#e377c2"}
MODES = {"prompt": "Prompting", "finetune": "Fine-tuning"}
REQUIRED = ("model", "mode", "method", "question_set", "em")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mbt])\s*$", re.IGNORECASE)


@dataclass
class PlotConfig:
    summaries: list[str] = field(default_factory=list)  # summary.json files written by eval
    out_dir: str = "runs/plot"
    name: str = "figure3"  # file stem of the figure
    title: str | None = None
    reference_points: bool = True  # ReAct paper Table 1 (540B) and FireAct's published numbers
    fireact_runs: list[str] = field(default_factory=list)  # FireAct trajs/*.json (or folder): recomputed points
    allow_mixed_question_sets: bool = False
    clear_margin: float = 0.0  # EM points by which ordering 5's "clearly below" must hold


@dataclass
class OrderingResult:
    number: int
    statement: str
    verdict: str  # holds | fails | partly holds | cannot check
    details: list[str]
    caveats: list[str] = field(default_factory=list)  # e.g. checked at other sizes, within noise

    def to_dict(self) -> dict:
        return {"ordering": self.number, "statement": self.statement, "verdict": self.verdict,
                "caveats": self.caveats, "details": self.details}


# ---------------------------------------------------------------- reading summaries


def load_summaries(paths: list[str | Path]) -> list[dict]:
    """Every row of every summary file, validated, with `params_b` resolved and `origin` noted."""
    if not paths:
        raise PipelineError("plot: no summaries given; set summaries=[runs/eval/<experiment>/summary.json]")
    rows = []
    for path in map(Path, paths):
        if not path.is_file():
            raise PipelineError(f"{path}: summary file not found; run `python -m pipeline eval` first")
        if (path.parent / "manifest.json").exists():  # ours (imported summaries have none)
            require_complete(path.parent / "manifest.json", f"summary {path}")
        data = read_json(path)
        if not isinstance(data, list):
            raise PipelineError(f"{path}: expected a JSON list of summary rows (README, Formats between stages)")
        if not data:
            raise PipelineError(f"{path}: the summary is empty (no evaluated rows); run eval on at least one model")
        rows += [validate_row(row, f"{path} row {i}") for i, row in enumerate(data)]
    return merge_shards(rows)


# Per-question means of eval's summary rows (pipeline.episodes.method_stats), and sums.
SHARD_MEANS = ("em", "f1", "finish_rate", "mean_steps")
SHARD_SUMS = ("n", "errors", "prompt_tokens", "completion_tokens", "seconds")


def merge_shards(rows: list[dict]) -> list[dict]:
    """One row per shard set (pipeline.shards) in place of its shards' rows; other rows as they are."""
    from pipeline.shards import parse_shard

    groups: dict[tuple, list[dict]] = {}
    out: list[dict | tuple] = []
    for row in rows:
        if row.get("shard") is None:
            out.append(row)
            continue
        shard = parse_shard(row["shard"])
        key = tuple(str(row.get(k)) for k in ("mode", "model", "size_class", "params_b", "method", "question_set",
                                                "precision", "train_precision", "source")) + (shard.count,)
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(row)
    return [item if isinstance(item, dict) else merged_row(groups[item]) for item in out]


def merged_row(rows: list[dict]) -> dict:
    from pipeline.shards import check_shard_set, parse_shard

    what = f"plot: {rows[0]['model']} / {rows[0]['method']} shards"
    check_shard_set([(parse_shard(r["shard"]), r["origin"]) for r in rows], what)
    missing = [k for k in ("n", *SHARD_MEANS) if not all(isinstance(r.get(k), int | float) for r in rows)]
    if missing or not all(r["n"] > 0 for r in rows):
        raise PipelineError(f"{what}: each shard's row needs n > 0 and {', '.join(SHARD_MEANS)} to be merged")
    n = sum(r["n"] for r in rows)
    merged = {k: v for k, v in rows[0].items() if k != "shard"}
    merged.update({k: sum(r[k] * r["n"] for r in rows) / n for k in SHARD_MEANS})
    merged.update({k: sum(r.get(k) or 0 for r in rows) for k in SHARD_SUMS})
    merged["seconds"] = round(merged["seconds"], 2)
    merged["shards"] = len(rows)
    merged["origin"] = " + ".join(r["origin"] for r in sorted(rows, key=lambda r: parse_shard(r["shard"]).index))
    return merged


def validate_row(row: dict, where: str) -> dict:
    if not isinstance(row, dict):
        raise PipelineError(f"{where}: expected an object")
    missing = [k for k in REQUIRED if row.get(k) in (None, "")]
    if missing:
        raise PipelineError(f"{where}: missing {', '.join(missing)} (README, Formats between stages: Summary)")
    if row["mode"] not in MODES:
        raise PipelineError(f"{where}: mode must be 'prompt' or 'finetune', got {row['mode']!r}")
    em = row["em"]
    if not isinstance(em, int | float) or not 0.0 <= em <= 1.0:
        raise PipelineError(f"{where}: em must be a fraction between 0 and 1, got {em!r}")
    row = dict(row, params_b=resolve_params_b(row, where), origin=where)
    row["size_class"] = str(row.get("size_class") or _size_label(row["params_b"])).lower()
    return row


def resolve_params_b(row: dict, where: str) -> float:
    """params_b as given, else read from a size class like "8b" / "135m"; otherwise a clear error."""
    value = row.get("params_b")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    m = _SIZE.match(str(row.get("size_class") or ""))
    if m:
        return float(m.group(1)) * {"m": 1e-3, "b": 1.0, "t": 1e3}[m.group(2).lower()]
    raise PipelineError(
        f"{where}: model {row.get('model')!r} has unknown size class {row.get('size_class')!r} and no params_b; "
        "set params_b (billions of parameters) or a size_class like '8b' / '135m'"
    )


def _size_label(params_b: float) -> str:
    return f"{params_b * 1000:g}m" if params_b < 1 else f"{params_b:g}b"


def check_question_sets(rows: list[dict], allow_mixed: bool) -> list[str]:
    sets = sorted({r["question_set"] for r in rows})
    if len(sets) > 1 and not allow_mixed:
        where = {s: next(r["origin"] for r in rows if r["question_set"] == s) for s in sets}
        raise PipelineError(
            "plot: summaries from different question sets in one figure ("
            + "; ".join(f"{s} e.g. {w}" for s, w in where.items())
            + "); plot them separately or set allow_mixed_question_sets=true"
        )
    return sets


def precision_of(row: dict) -> str:
    """"bf16", or "bf16-trained fp32" for a student trained in one precision and run in another."""
    run, trained = row.get("precision") or "unrecorded", row.get("train_precision")
    return run if trained in (None, run) else f"{trained}-trained {run}"


def label_precisions(rows: list[dict]) -> None:
    """Summaries computed in different precisions are never drawn as one: when they differ, every
    model label carries its precision (so the figure, the tables and the orderings check keep
    them apart), and one line says so."""
    kinds = sorted({precision_of(r) for r in rows})
    if len(kinds) < 2:
        return
    print(f"note: the summaries mix precisions ({', '.join(kinds)}); each model is labelled with its own")
    for row in rows:
        row["model"] = f"{row['model']} [{precision_of(row)}]"


def check_duplicates(rows: list[dict]) -> None:
    seen: dict[tuple, str] = {}
    for row in rows:
        key = (row["mode"], row["model"], row["size_class"], row["method"], row["question_set"])
        if key in seen:
            raise PipelineError(f"plot: {row['origin']} repeats {seen[key]} ({'/'.join(map(str, key))}); keep one of them")
        seen[key] = row["origin"]


# ---------------------------------------------------------------- the orderings check


def check_orderings(rows: list[dict], references: list[dict] | None = None, margin: float = 0.0) -> list[OrderingResult]:
    """The paper's five statements about figure 3, each judged on `rows` (our data) only, except
    that ordering 4 falls back to the paper's own 540B numbers (`references`) when the data has no
    540B prompting rows. A statement whose sizes or methods are missing is 'cannot check'."""
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)  # (mode, size_class, model) -> method -> row
    for row in rows:
        groups[(row["mode"], row["size_class"], row["model"])][row["method"]] = row
    return [
        _per_group(1, groups, "prompt", _react_worst),
        _per_group(2, groups, "finetune", _react_best),
        _beats_larger(3, rows, "8b", "62b", []),
        _beats_larger(4, rows, "62b", "540b", references or []),
        _per_group(5, groups, "finetune", lambda m: _standard_cot_below(m, margin)),
    ]


PAPER_SIZES = ("8b", "62b")  # where the paper states orderings 1, 2 and 5


def _per_group(number: int, groups: dict, mode: str, judge) -> OrderingResult:
    """Judge each model of `mode` that has all four methods. The verdict counts the paper's sizes
    (8b, 62b) when the data has them, otherwise every size, and says so."""
    mode_groups = sorted(((size, model), methods) for (m, size, model), methods in groups.items() if m == mode)
    at_paper_sizes = any(size in PAPER_SIZES for (size, _), _ in mode_groups)
    details, outcomes, sizes, noisy = [], [], set(), []
    for (size, model), methods in mode_groups:
        missing = [METHOD_LABELS[m] for m in FOUR if m not in methods]
        if missing:
            details.append(f"{model} ({size}): cannot check, missing {', '.join(missing)}")
            continue
        ok, text = judge(methods)
        counted = size in PAPER_SIZES or not at_paper_sizes
        if counted:
            outcomes.append(ok)
            sizes.add(size)
            noisy.append("within noise" in text)
        details.append(f"{model} ({size}): {'holds' if ok else 'fails'}: {text}"
                       + ("" if counted else " (not counted: the paper states this at 8B and 62B)"))
    if outcomes and not at_paper_sizes:
        details.append(f"note: the paper states this at 8B and 62B; checked here only at {', '.join(sorted(sizes))}")
    if not mode_groups:
        details.append(f"no {MODES[mode].lower()} rows")
    caveats = [f"only at {', '.join(sorted(sizes))}, not the paper's 8B/62B"] if outcomes and not at_paper_sizes else []
    return OrderingResult(number, ORDERINGS[number], _verdict(outcomes), details, caveats + _noise_caveat(noisy))


def _react_worst(methods: dict) -> tuple[bool, str]:
    others = {m: methods[m] for m in FOUR if m != "react"}
    worst_other = min(others.values(), key=lambda r: r["em"])
    ok = all(methods["react"]["em"] < r["em"] for r in others.values())
    return ok, f"ReAct {_pct(methods['react'])} vs lowest other {_label(worst_other)} {_pct(worst_other)}" + _noise(methods["react"], worst_other)


def _react_best(methods: dict) -> tuple[bool, str]:
    others = {m: methods[m] for m in FOUR if m != "react"}
    best_other = max(others.values(), key=lambda r: r["em"])
    ok = all(methods["react"]["em"] > r["em"] for r in others.values())
    return ok, f"ReAct {_pct(methods['react'])} vs best other {_label(best_other)} {_pct(best_other)}" + _noise(methods["react"], best_other)


def _standard_cot_below(methods: dict, margin: float) -> tuple[bool, str]:
    upper = max((methods["standard"], methods["cot"]), key=lambda r: r["em"])
    lower = min((methods["react"], methods["act"]), key=lambda r: r["em"])
    ok = 100 * (lower["em"] - upper["em"]) > margin if margin > 0 else lower["em"] > upper["em"]
    text = (f"best of Standard/CoT {_label(upper)} {_pct(upper)} vs worst of ReAct/Act {_label(lower)} {_pct(lower)}"
            + (f" (margin required {margin:g} pts)" if margin > 0 else ""))
    return ok, text + _noise(lower, upper)


def _beats_larger(number: int, rows: list[dict], small: str, large: str, references: list[dict]) -> OrderingResult:
    tuned = [r for r in rows if r["mode"] == "finetune" and r["method"] == "react" and r["size_class"] == small]
    prompted = [r for r in rows if r["mode"] == "prompt" and r["method"] in FOUR and r["size_class"] == large]
    details, source_note = [], ""
    if not prompted and references:
        prompted = [r for r in references if r["mode"] == "prompt" and r["method"] in FOUR and r["size_class"] == large]
        source_note = f" (the paper's published {large.upper()} numbers, not a run of ours: other setup and questions)"
    missing = []
    if not tuned:
        missing.append(f"no fine-tuned ReAct row at size class {small}")
    if not prompted:
        missing.append(f"no prompting rows at size class {large}")
    if missing:
        return OrderingResult(number, ORDERINGS[number], "cannot check", missing)
    best = max(prompted, key=lambda r: r["em"])
    outcomes, noisy = [], []
    for row in tuned:
        ok = row["em"] > best["em"]
        outcomes.append(ok)
        noisy.append(bool(_noise(row, best)))
        details.append(f"{row['model']} fine-tuned ReAct {_pct(row)} vs best {large} prompting "
                       f"{best['model']} {_label(best)} {_pct(best)}{source_note}: {'holds' if ok else 'fails'}"
                       + _noise(row, best))
    absent = [METHOD_LABELS[m] for m in FOUR if m not in {r["method"] for r in prompted}]
    details.append(f"compared with the figure's four methods at {large}"
                   + (f"; {', '.join(absent)} missing there" if absent else "")
                   + " (CoT-SC and hybrids are not part of figure 3)")
    caveats = ["against published numbers, not a run of ours"] if source_note else []
    return OrderingResult(number, ORDERINGS[number], _verdict(outcomes), details, caveats + _noise_caveat(noisy))


def _noise_caveat(noisy: list[bool]) -> list[str]:
    if noisy and all(noisy):
        return ["every deciding gap is within noise (its 95% interval contains 0)"]
    return ["some deciding gaps are within noise"] if any(noisy) else []


def _verdict(outcomes: list[bool]) -> str:
    if not outcomes:
        return "cannot check"
    if all(outcomes):
        return "holds"
    return "fails" if not any(outcomes) else "partly holds"


def _pct(row: dict) -> str:
    return f"{100 * row['em']:.1f}"


def _label(row: dict) -> str:
    return METHOD_LABELS.get(row["method"], row["method"])


def _noise(a: dict, b: dict) -> str:
    """Flag a gap whose 95% interval (Newcombe's, from the two Wilson intervals the table and the
    figure show) contains 0, when both question counts are known."""
    if not a.get("n") or not b.get("n"):
        return ""
    ci = difference_interval(round(a["em"] * a["n"]), a["n"], round(b["em"] * b["n"]), b["n"])
    if not ci[0] <= 0 <= ci[1]:
        return ""
    return (f" [within noise: gap {100 * (a['em'] - b['em']):+.1f} pts, 95% interval "
            f"{100 * ci[0]:+.1f} to {100 * ci[1]:+.1f}]")


def _interval(row: dict) -> tuple[float, float] | None:
    """The row's EM 95% Wilson interval as fractions, or None when its question count is unknown."""
    n = row.get("n")
    return rate_interval(row["em"], n) if isinstance(n, int) and n > 0 else None


def _pct_ci(row: dict) -> str:
    ci = _interval(row)
    return _pct(row) + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def orderings_text(results: list[OrderingResult]) -> str:
    lines = ["# The paper's figure-3 orderings, checked on these results", ""]
    for r in results:
        caveats = f" ({'; '.join(r.caveats)})" if r.caveats else ""
        lines.append(f"{r.number}. {r.statement} -> **{r.verdict}**{caveats}")
        lines += [f"   - {d}" for d in r.details]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- tables


CSV_COLUMNS = ("source", "mode", "model", "size_class", "params_b", "method", "question_set", "n",
               "em_pct", "em_lo_pct", "em_hi_pct", "f1_pct", "finish_rate", "mean_steps", "reference")


def results_csv(rows: list[dict], references: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in [*_sorted(rows), *_sorted(references)]:
        ci = _interval(row) or (None, None)
        writer.writerow({
            **{k: row.get(k) for k in CSV_COLUMNS},
            "em_lo_pct": None if ci[0] is None else round(100 * ci[0], 2),
            "em_hi_pct": None if ci[1] is None else round(100 * ci[1], 2),
            "source": row.get("source") or "ours",
            "em_pct": round(100 * row["em"], 2),
            "f1_pct": None if row.get("f1") is None else round(100 * row["f1"], 2),
            "reference": row.get("reference") or row.get("note") or "",
        })
    return out.getvalue()


def results_markdown(rows: list[dict], references: list[dict], question_sets: list[str]) -> str:
    lines = [f"# HotpotQA EM (%) by model size: {', '.join(question_sets)}", "",
             "Each cell: EM [95% Wilson interval over the n questions] (n=questions).", ""]
    for mode, title in MODES.items():
        mode_rows = [r for r in rows if r["mode"] == mode]
        if not mode_rows:
            lines += [f"## {title}", "", "(no rows)", ""]
            continue
        columns = sorted({(r["params_b"], r["size_class"], r["model"]) for r in mode_rows})
        methods = [m for m in (*FOUR, *MARKER_METHODS) if any(r["method"] == m for r in mode_rows)]
        methods += sorted({r["method"] for r in mode_rows} - set(methods))
        cell = {(r["params_b"], r["size_class"], r["model"], r["method"]): r for r in mode_rows}
        lines += [f"## {title}", "", "| method | " + " | ".join(f"{m} ({s})" for _, s, m in columns) + " |",
                  "|---|" + "---:|" * len(columns)]
        for method in methods:
            cells = [cell.get((*c, method)) for c in columns]
            lines.append(f"| {METHOD_LABELS.get(method, method)} | "
                         + " | ".join(f"{_pct_ci(r)} (n={r.get('n')})" if r else "–" for r in cells) + " |")
        lines.append("")
    if references:
        lines += ["## Reference points (published, not run here)", "",
                  "| source | model | mode | method | EM | reference |", "|---|---|---|---|---:|---|"]
        lines += [f"| {r['source']} | {r['model']} | {r['mode']} | {_label(r)} | {_pct(r)} | "
                  f"{r.get('reference') or r.get('note') or ''} |" for r in _sorted(references)]
        lines.append("")
    return "\n".join(lines)


def _sorted(rows: list[dict]) -> list[dict]:
    order = {m: i for i, m in enumerate((*FOUR, *MARKER_METHODS))}
    return sorted(rows, key=lambda r: (r["mode"] != "prompt", r["params_b"], r["model"], order.get(r["method"], 99)))


# ---------------------------------------------------------------- the figure


def draw_figure(rows: list[dict], references: list[dict], title: str):
    """The two-panel figure; returns the matplotlib Figure (Agg backend, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    top = max([100 * (_interval(r) or (0, r["em"]))[1] for r in [*rows, *references]] + [10.0])
    released = [r for r in rows if r.get("released")]
    for ax, (mode, panel) in zip(axes, MODES.items(), strict=True):
        mode_rows = [r for r in rows if r["mode"] == mode and not r.get("released")]
        for i, method in enumerate(FOUR):
            # a small multiplicative offset per method keeps equal EMs at one size visible
            dodge = 1.07 ** (i - 1.5)
            method_rows = sorted((r for r in mode_rows if r["method"] == method), key=lambda r: r["params_b"])
            if method_rows:
                xs, ys = [r["params_b"] * dodge for r in method_rows], [100 * r["em"] for r in method_rows]
                ax.errorbar(xs, ys, yerr=_error_bars(method_rows), marker="o", color=COLORS[method],
                            label=METHOD_LABELS[method], capsize=3, elinewidth=1)
        for method in MARKER_METHODS:
            points = [(r["params_b"], 100 * r["em"]) for r in mode_rows if r["method"] == method]
            if points:
                ax.scatter(*zip(*points, strict=True), marker="s", s=45, color=COLORS[method],
                           label=METHOD_LABELS[method], zorder=3)
        mode_refs = [r for r in references if r["mode"] == mode]
        _draw_references(ax, mode_refs)
        mode_released = [r for r in released if r["mode"] == mode]
        _draw_released(ax, mode_released)
        ours = sorted({r["params_b"] for r in mode_rows} | {r["params_b"] for r in mode_released})
        everything = sorted({*ours, *(r["params_b"] for r in mode_refs)})
        ax.set_xscale("log")
        if everything:
            # ticks name our sizes only; a reference point's label carries its own size
            ax.set_xticks(ours, [_tick(x) for x in ours])
            ax.minorticks_off()
            ax.set_xlim(everything[0] / 1.8, everything[-1] * 2.5)
        ax.set_title(panel)
        ax.set_xlabel("model size (parameters, log scale)")
        ax.grid(alpha=0.3)
        if not mode_rows and not mode_released:
            ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", color="gray")
    axes[0].set_ylabel("HotpotQA EM (%)")
    axes[0].set_ylim(-1.5, top * 1.15 + 2)  # below 0 so points at EM 0 are not cut
    shown = {r["method"] for r in [*rows, *references]}
    handles = [Line2D([], [], color=COLORS[m], marker="o", label=METHOD_LABELS[m]) for m in FOUR if m in shown]
    handles += [Line2D([], [], color=COLORS[m], marker="s", linestyle="none", label=METHOD_LABELS[m])
                for m in MARKER_METHODS if m in shown]
    if released:
        handles.append(Line2D([], [], color="black", marker=RELEASED_MARKER, linestyle="none",
                              label="released fine-tuned agent, evaluated here"))
    kinds = {_ref_kind(r) for r in references}
    handles += [Line2D([], [], color="black", marker=mk, markerfacecolor="none", linestyle="none", label=lab)
                for src, mk, lab in REFERENCE_STYLES if src in kinds]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.03), ncol=min(len(handles), 6),
               fontsize=8, frameon=False)
    if references:
        fig.text(0.995, 0.005, "hollow/x markers: published results on other question sets and tools "
                 "(ReAct: PaLM + Wikipedia API; FireAct: Google search), not runs of this pipeline",
                 ha="right", va="bottom", fontsize=6, color="gray")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def _error_bars(rows: list[dict]) -> list[list[float]]:
    """[below, above] distances (EM points) to each row's 95% Wilson interval; 0 where n is unknown."""
    below, above = [], []
    for row in rows:
        ci = _interval(row) or (row["em"], row["em"])
        below.append(max(0.0, 100 * (row["em"] - ci[0])))  # em * n may round: never a negative bar
        above.append(max(0.0, 100 * (ci[1] - row["em"])))
    return [below, above]


# (kind, marker, legend text); a released run recomputed here is kind "fireact-run"
REFERENCE_STYLES = (("paper", "*", "ReAct paper, published"), ("fireact", "D", "FireAct, published"),
                    ("fireact-run", "x", "FireAct released run, EM recomputed"))


def _ref_kind(ref: dict) -> str:
    return "fireact-run" if ref.get("file") else ref["source"]


def _draw_references(ax, refs: list[dict]) -> None:
    """Hollow markers in the method's colour; one label per reference model, beside its top point."""
    markers = {kind: marker for kind, marker, _ in REFERENCE_STYLES}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for ref in refs:
        kind = _ref_kind(ref)
        color = COLORS.get(ref["method"], "black")
        style = {"color": color} if markers[kind] == "x" else {"facecolors": "none", "edgecolors": color}
        ax.scatter([ref["params_b"]], [100 * ref["em"]], marker=markers[kind], s=80, linewidths=1.4, zorder=4, **style)
        groups[(ref["params_b"], _base_model(ref["model"]))].append(ref)
    for (params_b, model), members in groups.items():
        top = max(members, key=lambda r: r["em"])
        label = model if len(members) > 1 and len({m["method"] for m in members}) > 1 else f"{model} {_label(top)}"
        ax.annotate(label, (params_b, 100 * top["em"]), textcoords="offset points", xytext=(7, 4), fontsize=7)


RELEASED_MARKER = "P"  # filled plus: a checkpoint trained elsewhere, run through our environment here


def _draw_released(ax, rows: list[dict]) -> None:
    """Each released checkpoint's point, in its method's colour, labelled with its own name;
    never joined into our students' lines."""
    for row in rows:
        ax.scatter([row["params_b"]], [100 * row["em"]], marker=RELEASED_MARKER, s=90, zorder=5,
                   color=COLORS.get(row["method"], "black"), edgecolors="black", linewidths=0.6)
        ax.annotate(row["model"], (row["params_b"], 100 * row["em"]), textcoords="offset points",
                    xytext=(7, -10), fontsize=7)


def _base_model(model: str) -> str:
    """"Llama-2-7B (FireAct LoRA) run" -> "Llama-2-7B": a published point and a recomputed run share a label."""
    return re.sub(r"\s*\(.*$", "", model)


def _tick(params_b: float) -> str:
    return f"{params_b * 1000:g}M" if params_b < 1 else f"{params_b:g}B"


def save_figure(fig, path: Path, fmt: str) -> None:
    import matplotlib

    # no timestamps and fixed SVG ids, so a re-plot of the same data gives the same bytes
    with atomic_path(path) as tmp, matplotlib.rc_context({"svg.hashsalt": "react-pipeline"}):
        fig.savefig(tmp, format=fmt, dpi=150, metadata={"Date": None} if fmt == "svg" else {"Software": None})


# ---------------------------------------------------------------- the stage


def collect_references(cfg: PlotConfig) -> list[dict]:
    references = reference_rows() if cfg.reference_points else []
    if cfg.fireact_runs:
        from pipeline.importers import read_fireact_eval_runs

        for path in cfg.fireact_runs:
            for row in read_fireact_eval_runs(path):
                if row["params_b"] is None:
                    print(f"note: {row['model']} ({row['file']}) has no published size; not plotted")
                    continue
                row["model"] = f"{row['model']} run"
                references.append(row)
    return references


def run_plot(cfg: PlotConfig) -> dict[str, Path]:
    """Write the figure, tables and orderings check; returns their paths by kind."""
    check_writable_dir(cfg.out_dir)
    rows = load_summaries(cfg.summaries)
    question_sets = check_question_sets(rows, cfg.allow_mixed_question_sets)
    label_precisions(rows)
    check_duplicates(rows)
    references = collect_references(cfg)
    # The paper's orderings are about students trained by this recipe: released agents are plotted, not judged.
    results = check_orderings([r for r in rows if not r.get("released")], references, cfg.clear_margin)
    out = Path(cfg.out_dir)
    paths = {"png": out / f"{cfg.name}.png", "svg": out / f"{cfg.name}.svg", "csv": out / "results.csv",
             "md": out / "results.md", "orderings": out / "orderings.md", "orderings_json": out / "orderings.json"}
    remove_stale_temps(out)  # a killed run's half-written figure or tables
    title = cfg.title or f"HotpotQA EM: prompting vs fine-tuning ({', '.join(question_sets)})"
    fig = draw_figure(rows, references, title)
    try:
        save_figure(fig, paths["png"], "png")
        save_figure(fig, paths["svg"], "svg")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    atomic_write_text(paths["csv"], results_csv(rows, references))
    atomic_write_text(paths["md"], results_markdown(rows, references, question_sets))
    text = orderings_text(results)
    atomic_write_text(paths["orderings"], text)
    atomic_write_json(paths["orderings_json"], [r.to_dict() for r in results])
    write_manifest(out / "manifest.json", stage="plot", config=to_dict(cfg), complete=True,
                   inputs=[file_fingerprint(p) for p in cfg.summaries], rows=len(rows),
                   references=len(references), outputs={k: str(v) for k, v in paths.items()},
                   orderings={r.number: r.verdict for r in results})
    print(results_markdown(rows, [], question_sets))
    print(text)
    print(f"figure: {paths['png']} and {paths['svg']}; table: {paths['md']}, {paths['csv']}")
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, PlotConfig)


def main(args: argparse.Namespace) -> int:
    run_plot(stage_config(PlotConfig, args, section="plot"))
    return 0
