"""Eval's summary rows as `plot` reads them: validated (a row without `task` is HotpotQA's), with
`params_b` resolved and `origin` noted, the shards of a sharded eval (`shard=i/n`,
pipeline.core.shards) merged into one row per model and method (counts summed, rates weighted by each
shard's question count; an incomplete shard set is refused); and a row's EM as the tables and
the orderings check print it.

    rows = load_summaries(["runs/eval/demo/summary.json"])
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import read_json, require_complete
from pipeline.hub.models import size_label
from pipeline.methods.registry import method_spec
from pipeline.report.intervals import difference_interval, rate_interval
from pipeline.tasks import Task, get_task, task_of

MODES = {"prompt": "Prompting", "finetune": "Fine-tuning"}  # mode -> its panel and table section
REQUIRED = ("model", "mode", "method", "question_set", "em")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mbt])\s*$", re.IGNORECASE)
# A student trained on the stand-in teacher's data is named `<student>-oracle-data` (a grid's
# compare_oracle); teachers.md pairs it with `<student>` by that name.
ORACLE_DATA_SUFFIX = "-oracle-data"


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
            raise PipelineError(f"{path}: expected a JSON list of summary rows (docs/formats.md)")
        if not data:
            raise PipelineError(f"{path}: the summary is empty (no evaluated rows); run eval on at least one model")
        rows += [validate_row(row, f"{path} row {i}") for i, row in enumerate(data)]
    return merge_shards(rows)


def one_x_per_size(rows: list[dict]) -> list[dict]:
    """Rows of one model size at one x: the first row's `params_b` for every later row of the same
    size class within 2% of it. A grid's eval states a student's size (0.135 for SmolLM2-135M),
    an `eval` of a final/ alone reads the count its manifest wrote (0.134515008): two ticks
    ("135M" over "134.515M") and two columns in the sizes figure for one student otherwise.
    Different models of one class (8B: 8.03 and 7.6) stay apart."""
    seen: dict[str, list[float]] = {}
    out = []
    for row in rows:
        xs = seen.setdefault(row.get("size_class") or "", [])
        x = next((x for x in xs if abs(row["params_b"] - x) <= 0.02 * x), None)
        if x is None:
            xs.append(row["params_b"])
        out.append(row if x is None or x == row["params_b"] else dict(row, params_b=x))
    return out


# Per-question means of eval's summary rows (pipeline.agent.episodes.method_stats), and sums.
SHARD_MEANS = ("em", "f1", "finish_rate", "mean_steps")
SHARD_SUMS = ("n", "errors", "prompt_tokens", "completion_tokens", "seconds")


def merge_shards(rows: list[dict]) -> list[dict]:
    """One row per shard set (pipeline.core.shards) in place of its shards' rows; other rows as they are."""
    from pipeline.core.shards import parse_shard

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
    from pipeline.core.shards import check_shard_set, parse_shard

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
        raise PipelineError(f"{where}: missing {', '.join(missing)} (docs/formats.md: Summary)")
    if row["mode"] not in MODES:
        raise PipelineError(f"{where}: mode must be 'prompt' or 'finetune', got {row['mode']!r}")
    try:  # a method without a registry row would have no label, colour or marker: refused, never dropped
        method_spec(row["method"])
    except PipelineError as e:
        raise PipelineError(f"{where}: {e} (a method is drawn from its row in pipeline/methods/registry.py)") from None
    em = row["em"]
    if not isinstance(em, int | float) or not 0.0 <= em <= 1.0:
        raise PipelineError(f"{where}: em must be a fraction between 0 and 1, got {em!r}")
    # `name`: the model as its summary names it; the plot's labels (precision, search mode) go on
    # `model`, and a table that pairs rows across summaries pairs them by `name`
    row = dict(row, params_b=resolve_params_b(row, where), origin=where, name=row["model"])
    row["size_class"] = str(row.get("size_class") or size_label(row["params_b"])).lower()
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


def search_of_row(row: dict) -> str:
    """A summary row's wiki.search mode (rows written before the key searched by exact title)."""
    return row.get("search") or "title"


def check_search_modes(rows: list[dict]) -> str:
    """The one wiki.search mode of the rows, said as the figure and tables say it ("title search"
    or "bm25 search"); summaries of both modes in one figure are refused in one line. A student
    evaluated in the mode it was not trained in (eval's allow_search_mismatch) is labelled so."""
    modes = sorted({search_of_row(r) for r in rows})
    if len(modes) > 1:
        where = {m: next(r["origin"] for r in rows if search_of_row(r) == m) for m in modes}
        raise PipelineError("plot: summaries of different wiki.search modes in one figure ("
                            + "; ".join(f"{m} e.g. {w}" for m, w in where.items()) + "); plot each mode separately")
    for row in rows:
        if row.get("trained_search") not in (None, search_of_row(row)):
            row["model"] = f"{row['model']} (trained on {row['trained_search']} search)"
    return f"{modes[0] if modes else 'title'} search"


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


def check_task(rows: list[dict]) -> Task:
    """The one task every row answers (a row older than the `task` key: HotpotQA)."""
    tasks = sorted({task_of(r) for r in rows})
    if len(tasks) > 1:
        where = {t: next(r["origin"] for r in rows if task_of(r) == t) for t in tasks}
        raise PipelineError("plot: summaries of different tasks in one figure ("
                            + "; ".join(f"{t} e.g. {w}" for t, w in where.items()) + "); plot each task separately")
    return get_task(tasks[0] if tasks else None)


def check_duplicates(rows: list[dict]) -> None:
    seen: dict[tuple, str] = {}
    for row in rows:
        key = (row["mode"], row["model"], row["size_class"], row["method"], row["question_set"])
        if key in seen:
            raise PipelineError(f"plot: {row['origin']} repeats {seen[key]} ({'/'.join(map(str, key))}); keep one of them")
        seen[key] = row["origin"]


# ---------------------------------------------------------------- a row as the report prints it


def em_interval(row: dict) -> tuple[float, float] | None:
    """The row's EM 95% Wilson interval as fractions, or None when its question count is unknown."""
    n = row.get("n")
    return rate_interval(row["em"], n) if isinstance(n, int) and n > 0 else None


def em_gap_interval(a: dict, b: dict) -> tuple[float, float] | None:
    """Newcombe's 95% interval of a's EM minus b's (fractions), from the two rows' counts; None
    when either question count is unknown."""
    if not a.get("n") or not b.get("n"):
        return None
    return difference_interval(round(a["em"] * a["n"]), a["n"], round(b["em"] * b["n"]), b["n"])


def pct(row: dict) -> str:
    return f"{100 * row['em']:.1f}"


def pct_ci(row: dict) -> str:
    ci = em_interval(row)
    return pct(row) + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def is_grpo(row: dict) -> bool:
    """A GRPO student's row (eval writes `training: grpo` for a `grpo` final/): drawn with its own
    marker, not judged by the paper's orderings (they are about the SFT recipe)."""
    return row.get("training") == "grpo"


def method_label(row: dict) -> str:
    return method_spec(row["method"]).label
