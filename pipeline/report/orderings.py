"""The five orderings the ReAct paper states about its figure 3, each judged on our rows: a gap is
called within noise when Newcombe's 95% interval for it (from the two rows' Wilson intervals)
contains 0. Only HotpotQA's figure states them (`Task.states_orderings`).

    results = check_orderings(rows, task.reference_rows())
    print(orderings_text(results, task))
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pipeline.methods.registry import figure_rank, method_spec
from pipeline.report.references import ORDERINGS
from pipeline.report.summaries import MODES, em_gap_interval, method_label, pct
from pipeline.tasks import Task, get_task

FIGURE3_METHODS = ("standard", "cot", "act", "react")  # the four the paper's orderings compare
PAPER_SIZES = ("8b", "62b")  # where the paper states orderings 1, 2 and 5


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


def _per_group(number: int, groups: dict, mode: str, judge) -> OrderingResult:
    """Judge each model of `mode` that has all four methods. The verdict counts the paper's sizes
    (8b, 62b) when the data has them, otherwise every size, and says so."""
    mode_groups = sorted(((size, model), methods) for (m, size, model), methods in groups.items() if m == mode)
    at_paper_sizes = any(size in PAPER_SIZES for (size, _), _ in mode_groups)
    details, outcomes, sizes, noisy = [], [], set(), []
    for (size, model), methods in mode_groups:
        missing = [method_spec(m).label for m in FIGURE3_METHODS if m not in methods]
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
    others = {m: methods[m] for m in FIGURE3_METHODS if m != "react"}
    worst_other = min(others.values(), key=lambda r: r["em"])
    ok = all(methods["react"]["em"] < r["em"] for r in others.values())
    return ok, (f"ReAct {pct(methods['react'])} vs lowest other {method_label(worst_other)} {pct(worst_other)}"
                + _noise(methods["react"], worst_other))


def _react_best(methods: dict) -> tuple[bool, str]:
    others = {m: methods[m] for m in FIGURE3_METHODS if m != "react"}
    best_other = max(others.values(), key=lambda r: r["em"])
    ok = all(methods["react"]["em"] > r["em"] for r in others.values())
    return ok, (f"ReAct {pct(methods['react'])} vs best other {method_label(best_other)} {pct(best_other)}"
                + _noise(methods["react"], best_other))


def _standard_cot_below(methods: dict, margin: float) -> tuple[bool, str]:
    upper = max((methods["standard"], methods["cot"]), key=lambda r: r["em"])
    lower = min((methods["react"], methods["act"]), key=lambda r: r["em"])
    ok = 100 * (lower["em"] - upper["em"]) > margin if margin > 0 else lower["em"] > upper["em"]
    text = (f"best of Standard/CoT {method_label(upper)} {pct(upper)} vs worst of ReAct/Act "
            f"{method_label(lower)} {pct(lower)}" + (f" (margin required {margin:g} pts)" if margin > 0 else ""))
    return ok, text + _noise(lower, upper)


def _beats_larger(number: int, rows: list[dict], small: str, large: str, references: list[dict]) -> OrderingResult:
    tuned = [r for r in rows if r["mode"] == "finetune" and r["method"] == "react" and r["size_class"] == small]
    prompted = [r for r in rows if r["mode"] == "prompt" and r["method"] in FIGURE3_METHODS and r["size_class"] == large]
    details, source_note = [], ""
    if not prompted and references:
        prompted = [r for r in references
                    if r["mode"] == "prompt" and r["method"] in FIGURE3_METHODS and r["size_class"] == large]
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
        details.append(f"{row['model']} fine-tuned ReAct {pct(row)} vs best {large} prompting "
                       f"{best['model']} {method_label(best)} {pct(best)}{source_note}: {'holds' if ok else 'fails'}"
                       + _noise(row, best))
    absent = [method_spec(m).label for m in FIGURE3_METHODS if m not in {r["method"] for r in prompted}]
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


def _noise(a: dict, b: dict) -> str:
    """Flag a gap whose 95% interval (Newcombe's, from the two Wilson intervals the table and the
    figure show) contains 0, when both question counts are known."""
    ci = em_gap_interval(a, b)
    if ci is None or not ci[0] <= 0 <= ci[1]:
        return ""
    return (f" [within noise: gap {100 * (a['em'] - b['em']):+.1f} pts, 95% interval "
            f"{100 * ci[0]:+.1f} to {100 * ci[1]:+.1f}]")


def orderings_text(results: list[OrderingResult], task: Task | None = None) -> str:
    lines = ["# The paper's figure-3 orderings, checked on these results", ""]
    task = get_task(task)
    if not task.states_orderings:
        lines.append(f"The paper's figure 3 is HotpotQA's; it states no orderings for {task.title}: none checked.")
    for r in results:
        caveats = f" ({'; '.join(r.caveats)})" if r.caveats else ""
        lines.append(f"{r.number}. {r.statement} -> **{r.verdict}**{caveats}")
        lines += [f"   - {d}" for d in r.details]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- across sizes


@dataclass
class SizeGap:
    """One across-size comparison: a smaller model fine-tuned against a larger one prompted."""

    method: str  # the fine-tuned smaller model's method (and the prompted larger one's, or "best")
    tuned: dict  # the smaller model's fine-tuned row
    prompted: dict  # the larger model's prompted row
    interval: tuple[float, float] | None  # Newcombe's 95% interval of tuned - prompted (fractions)

    @property
    def gap(self) -> float:
        return self.tuned["em"] - self.prompted["em"]

    @property
    def verdict(self) -> str:
        """holds | fails, and whether the gap is beyond noise (its interval excludes 0)."""
        side = "holds" if self.gap > 0 else "fails"
        if self.interval is None:
            return f"{side} (no question counts: noise unknown)"
        noisy = self.interval[0] <= 0 <= self.interval[1]
        return f"{side}, within noise" if noisy else f"{side}, beyond noise"

    def to_dict(self) -> dict:
        def point(row: dict) -> dict:
            return {k: row.get(k) for k in ("model", "size_class", "params_b", "mode", "method", "em", "n")}

        ci = self.interval
        return {"method": self.method, "finetuned_smaller": point(self.tuned), "prompted_larger": point(self.prompted),
                "gap_pct": round(100 * self.gap, 2),
                "interval_pct": None if ci is None else [round(100 * ci[0], 2), round(100 * ci[1], 2)],
                "verdict": self.verdict}

    def text(self) -> str:
        ci = self.interval
        bounds = "" if ci is None else f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
        return (f"{self.tuned['model']} ({self.tuned['size_class']}) fine-tuned {method_label(self.tuned)} "
                f"{pct(self.tuned)} vs {self.prompted['model']} ({self.prompted['size_class']}) prompted "
                f"{method_label(self.prompted)} {pct(self.prompted)}: gap {100 * self.gap:+.1f}{bounds} -> "
                f"**{self.verdict}**")


def model_sizes(rows: list[dict]) -> list[float]:
    """The distinct sizes (billions of parameters) of our own models: rows not released elsewhere."""
    return sorted({r["params_b"] for r in rows if not r.get("released")})


def across_sizes(rows: list[dict]) -> list[SizeGap]:
    """The paper's headline claim at every pair of our sizes: for each method, is the smaller model
    fine-tuned above the larger one prompted with the same method; and is the smaller model's
    fine-tuned ReAct above the larger one's best prompted method of the four (its figure-3 form:
    "fine-tuned ReAct-8B beats every 62B prompting method")? Each gap with Newcombe's 95% interval.
    `rows` are ours (no released agents, no GRPO or self-training points)."""
    gaps = []
    sizes = model_sizes(rows)
    for i, small in enumerate(sizes):
        for large in sizes[i + 1:]:
            tuned = [r for r in rows if r["mode"] == "finetune" and r["params_b"] == small]
            prompted = [r for r in rows if r["mode"] == "prompt" and r["params_b"] == large]
            for t in sorted(tuned, key=lambda r: figure_rank(r["method"])):
                gaps += [_gap(t["method"], t, p) for p in prompted if p["method"] == t["method"]]
            four = [p for p in prompted if p["method"] in FIGURE3_METHODS]
            for t in (r for r in tuned if r["method"] == "react"):
                if four:
                    gaps.append(_gap("best", t, max(four, key=lambda r: r["em"])))
    return gaps


def _gap(method: str, tuned: dict, prompted: dict) -> SizeGap:
    return SizeGap(method, tuned, prompted, em_gap_interval(tuned, prompted))


def across_sizes_text(gaps: list[SizeGap]) -> str:
    """The across-size section of orderings.md: one line per comparison, the headline ones last."""
    lines = ["", "## Across sizes: is the smaller model fine-tuned above the larger one prompted?", "",
             "Each gap is fine-tuned smaller minus prompted larger (EM points), with Newcombe's 95% interval; "
             "beyond noise when the interval excludes 0. Models of different families differ in more than size.", ""]
    if not gaps:
        lines.append("- cannot check: no size has fine-tuned rows with prompted rows of the same method at a larger size")
    same = [g for g in gaps if g.method != "best"]
    best = [g for g in gaps if g.method == "best"]
    lines += [f"- {g.text()}" for g in same]
    if best:
        lines += ["", "Fine-tuned ReAct of the smaller model against the larger model's best prompted method "
                  "(of Standard, CoT, Act, ReAct: the paper's figure-3 claim):", ""]
        lines += [f"- {g.text()}" for g in best]
    return "\n".join(lines) + "\n"
