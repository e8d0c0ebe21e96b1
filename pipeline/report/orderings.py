"""The five orderings the ReAct paper states about its figure 3, each judged on our rows: a gap is
called within noise when Newcombe's 95% interval for it (from the two rows' Wilson intervals)
contains 0. Only HotpotQA's figure states them (`Task.states_orderings`).

    results = check_orderings(rows, task.reference_rows())
    print(orderings_text(results, task))
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pipeline.methods.registry import method_spec
from pipeline.report.intervals import difference_interval
from pipeline.report.references import ORDERINGS
from pipeline.report.summaries import MODES, method_label, pct
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
    if not a.get("n") or not b.get("n"):
        return ""
    ci = difference_interval(round(a["em"] * a["n"]), a["n"], round(b["em"] * b["n"]), b["n"])
    if not ci[0] <= 0 <= ci[1]:
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
