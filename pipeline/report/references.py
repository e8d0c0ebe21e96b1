"""Published numbers the figure can show beside our runs, as data with their source.

Sources (figures as printed in the papers below):
  - Yao et al., "ReAct: Synergizing Reasoning and Acting in Language Models", ICLR 2023
    (arXiv 2210.03629), Table 1: PaLM-540B prompting, HotpotQA EM and FEVER accuracy (%).
  - Chen et al., "FireAct: Toward Language Agent Fine-tuning", 2023 (arXiv 2310.05915):
    Llama-2 on the ReAct 500-question HotpotQA dev sample with a Google-search tool.

Figure 3 of the ReAct paper (PaLM-8B/62B prompted vs fine-tuned) printed no values, so none are
here; its five orderings are in `ORDERINGS` and checked by pipeline.report.orderings. Each task
serves its own points (`Task.reference_rows`, which reads these); `collect_references` adds
FireAct's released runs, recomputed.

    python -c "from pipeline.report.references import reference_rows; print(reference_rows())"
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.core.errors import PipelineError
from pipeline.tasks import Task, get_task

REACT_PAPER = "Yao et al. 2023 (ReAct, ICLR), Table 1: PaLM-540B prompting"
FIREACT_PAPER = "Chen et al. 2023 (FireAct, arXiv 2310.05915), HotpotQA EM, Google search tool"

# PaLM-540B prompting, HotpotQA EM (%) and FEVER accuracy (%), ReAct paper Table 1.
TABLE1_HOTPOTQA_EM = {
    "standard": 28.7, "cot": 29.4, "cot_sc": 33.4, "act": 25.7, "react": 27.4,
    "cot_sc_to_react": 34.2, "react_to_cot_sc": 35.1,
}
TABLE1_FEVER_ACC = {
    "standard": 57.1, "cot": 56.3, "cot_sc": 60.4, "act": 58.9, "react": 60.9,
    "cot_sc_to_react": 64.6, "react_to_cot_sc": 62.0,
}
SUPERVISED_SOTA = {"hotpotqa_em": 67.5, "fever_acc": 89.5}
# The paper evaluates on HotpotQA dev questions; its code samples them with random.Random(233)
# (the "react-dev500" set), but Table 1 does not print its count, so none is claimed here.
PAPER_QUESTION_SET = "hotpotqa-dev (ReAct paper)"
# FEVER's: its notebook runs the same random.Random(233) sample of 500 claims of paper_dev.jsonl.
FEVER_PAPER_QUESTION_SET = "fever-dev (ReAct paper)"

# FireAct reference points with a known model size (HotpotQA EM %, ReAct format).
# Fine-tuned gpt-3.5 (~40) and text-davinci-002 ReAct prompting (~30) have no published size,
# so they cannot sit on a size axis and are left out.
FIREACT_POINTS = [
    {"model": "Llama-2-7B", "params_b": 7.0, "mode": "prompt", "method": "react", "em_pct": 14.8},
    {"model": "Llama-2-7B", "params_b": 7.0, "mode": "finetune", "method": "react", "em_pct": 26.2,
     "note": "fine-tuned on 500 GPT-4 ReAct trajectories"},
    {"model": "Llama-2-13B", "params_b": 13.0, "mode": "finetune", "method": "react", "em_pct": 34.4},
]

# The orderings the ReAct paper's text states about figure 3 (checked by pipeline.report.orderings).
ORDERINGS = {
    1: "Prompted at 8B and 62B, ReAct is the worst of the four methods.",
    2: "Fine-tuned, ReAct is the best of the four at both sizes.",
    3: "Fine-tuned ReAct-8B beats every 62B prompting method.",
    4: "Fine-tuned ReAct-62B beats every 540B prompting method.",
    5: "Fine-tuned Standard and CoT are clearly below fine-tuned ReAct and Act.",
}


def reference_rows() -> list[dict]:
    """The published points as summary rows (docs/formats.md), with `source` paper / fireact and a
    `reference` string naming the publication. Counts, F1 and costs were not published: None."""
    rows = [
        _row("PaLM-540B (ReAct paper)", "540b", 540.0, "prompt", method, em, "paper", REACT_PAPER,
             question_set=PAPER_QUESTION_SET, n=None)
        for method, em in TABLE1_HOTPOTQA_EM.items()
    ]
    for point in FIREACT_POINTS:
        rows.append(_row(f"{point['model']} (FireAct)", f"{int(point['params_b'])}b", point["params_b"],
                         point["mode"], point["method"], point["em_pct"], "fireact", FIREACT_PAPER,
                         question_set="react-dev500", n=500))
    return rows


def fever_reference_rows() -> list[dict]:
    """The paper's FEVER accuracy (Table 1, PaLM-540B prompting) as summary rows (`em` holds the
    accuracy, as in FEVER's records). Only prompting: the paper fine-tuned on HotpotQA alone."""
    return [_row("PaLM-540B (ReAct paper)", "540b", 540.0, "prompt", method, acc, "paper", REACT_PAPER,
                 question_set=FEVER_PAPER_QUESTION_SET, n=None)
            for method, acc in TABLE1_FEVER_ACC.items()]


def _row(model: str, size_class: str, params_b: float, mode: str, method: str, em_pct: float,
         source: str, reference: str, *, question_set: str, n: int | None) -> dict:
    return {
        "model": model, "size_class": size_class, "params_b": params_b, "mode": mode,
        "method": method, "question_set": question_set, "n": n, "em": em_pct / 100,
        "f1": None, "finish_rate": None, "mean_steps": None, "prompt_tokens": None,
        "completion_tokens": None, "seconds": None, "source": source, "reference": reference,
    }


def collect_references(task: Task | None = None, published: bool = True, fireact_runs: Sequence[str] = ()) -> list[dict]:
    """The reference points a figure of `task` shows: the task's published ones (unless
    `published` is off) and FireAct's released HotpotQA runs (trajs/*.json files or folders),
    their EM recomputed; a run without a published model size cannot be placed and is left out, said."""
    task = get_task(task)
    references = task.reference_rows() if published else []
    if fireact_runs:
        if task.name != "hotpotqa":
            raise PipelineError(f"plot: fireact_runs are HotpotQA evaluations; these summaries are {task.title}'s")
        from pipeline.hub.importers import read_fireact_eval_runs

        for path in fireact_runs:
            for row in read_fireact_eval_runs(path):
                if row["params_b"] is None:
                    print(f"note: {row['model']} ({row['file']}) has no published size; not plotted")
                    continue
                row["model"] = f"{row['model']} run"
                references.append(row)
    return references
