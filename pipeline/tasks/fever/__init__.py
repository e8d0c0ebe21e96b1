"""FEVER (Thorne et al. 2018), the paper's Table 1 fact-verification task: a claim, one of three
labels (SUPPORTS / REFUTES / NOT ENOUGH INFO) as the answer, accuracy as the metric.

    python -m pipeline data show react-dev500 --task fever
    python -m pipeline generate --config configs/fever.yaml

As the original code's `FeverWrapper` has it: the question line is `Claim: ...`, a Finish is
correct when its argument equals the label after HotpotQA's normalisation (so `Finish[not enough
info]` counts), and the record's `em` and `f1` both hold that 0/1 accuracy. The paper's exemplars
are `fever.json`'s three per format (`prompting.exemplars: paper`; FEVER has none of ours), and
inside the two hybrids ReAct has 5 steps (plain ReAct and Act keep `prompting.max_steps`, 7 as in
the released notebook's loop).

Question sets (claims of the ReAct repo's `paper_dev.jsonl`, ids are FEVER's own):
  paper-dev           all 9,999 claims, in file order
  react-dev500        the notebook's sample: random.Random(233) over the first 7,405 lines, first
                      500 (the claims of ReAct's 500 released FEVER trajectories)
  dev-bootstrap       the other 9,499 claims: a pool disjoint from react-dev500, for real runs
  offline-eval        100 claims of react-dev500 (random.Random(0) over it), and
  offline-bootstrap   the other 400: the claims whose pages the offline corpus holds, since it is
                      built from those trajectories' observations (pipeline/wiki/observed.py)
Offline numbers are therefore on the paper's own eval sample and a corpus made from its
trajectories: they test the machinery, not FEVER. Real runs use `wiki.backend: live` (every
answer cached on disk) on react-dev500, with dev-bootstrap to generate from.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.tasks.base import Task, normalize_answer

LABELS = ("SUPPORTS", "REFUTES", "NOT ENOUGH INFO")
REACT_SEED, REACT_RANGE, REACT_SAMPLE = 233, 7405, 500  # FEVER.ipynb: range(7405), Random(233), first 500
OFFLINE_SEED, OFFLINE_EVAL_SIZE = 0, 100
QUESTION_SETS = ("paper-dev", "react-dev500", "dev-bootstrap", "offline-eval", "offline-bootstrap")


@dataclass
class Claim:
    """One FEVER claim; `question` is the claim text (what every method reads), `answer` its label."""

    id: str
    question: str
    answer: str
    index: int  # its line in paper_dev.jsonl: the released trajectories' `question_idx`
    verifiable: str | None = None
    split: str = "paper_dev"
    source: str | None = None


def read_claims(path: str | Path) -> list[Claim]:
    """The claims of a FEVER JSONL file ({id, claim, label, ...} per line), in file order."""
    path = Path(path)
    claims = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"{path}: cannot read FEVER claims ({exc})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            claim, label = str(row["claim"]), str(row["label"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PipelineError(f"{path}:{lineno}: not a FEVER record with claim and label ({exc}); "
                                "fix or remove that line") from None
        if label not in LABELS:
            raise PipelineError(f"{path}:{lineno}: label {label!r} is not one of {', '.join(LABELS)}")
        claims.append(Claim(str(row.get("id", len(claims))), claim, label, len(claims),
                            row.get("verifiable"), source=path.name))
    if not claims:
        raise PipelineError(f"{path}: no FEVER claims in it")
    return claims


def react_sample() -> list[int]:
    """The notebook's 500 claim indices, in its order."""
    idx = list(range(REACT_RANGE))
    random.Random(REACT_SEED).shuffle(idx)
    return idx[:REACT_SAMPLE]


def load_question_set(name: str, limit: int | None = None) -> list[Claim]:
    """A named set of the module docstring, or a FEVER JSONL file; the first `limit` claims."""
    from pipeline.core.paths import resolve_source

    if name in QUESTION_SETS:
        claims = read_claims(resolve_source("fever-paper-dev"))
        sample = [claims[i] for i in react_sample()]
        if name == "paper-dev":
            chosen = claims
        elif name == "react-dev500":
            chosen = sample
        elif name == "dev-bootstrap":
            taken = set(react_sample())
            chosen = [c for c in claims if c.index not in taken]
        else:
            order = list(sample)
            random.Random(OFFLINE_SEED).shuffle(order)
            chosen = order[:OFFLINE_EVAL_SIZE] if name == "offline-eval" else order[OFFLINE_EVAL_SIZE:]
    elif Path(name).expanduser().is_file():
        chosen = read_claims(Path(name).expanduser())
    else:
        raise PipelineError(f"unknown FEVER question set '{name}'; use one of {', '.join(QUESTION_SETS)} "
                            "or a path to a FEVER .jsonl file")
    if limit is not None and limit < 0:
        raise PipelineError(f"limit must be >= 0, got {limit}")
    return chosen[:limit] if limit is not None else chosen


@functools.cache
def local_trajectories() -> dict:
    """ReAct's released FEVER trajectories by claim line where they are on this machine (never
    downloaded for this: a claim's pages are then unknown, and its index is not checked)."""
    from pipeline.core.paths import resolve_source
    from pipeline.tasks.fever.replay import released_trajectories

    try:
        return released_trajectories(resolve_source("react-fever-trajectories", download=False))
    except PipelineError:
        return {}


class Fever(Task):
    name = "fever"
    title = "FEVER"
    question_label = "Claim"
    metric_label = "accuracy"
    correct_rule = "the gold label (accuracy 1)"
    answer_space = LABELS
    question_sets = QUESTION_SETS
    hybrid_react_steps = 5  # the paper: "7 and 5 steps for HotpotQA and FEVER respectively"
    paper_prompts = "react-fever-prompts"
    paper_keys = {"react": "webthink_simple3", "act": "webact_simple3", "cot": "cotqa_simple3",
                  "standard": "webqa_simple3"}
    citation = "FEVER (Thorne et al. 2018)"
    data_kind = "claims and labels"
    licence = "CC BY-SA 3.0"
    hub_dataset = "fever/fever"
    oracle_source = "oracle: a replay of ReAct's released text-davinci-002 FEVER trajectories"
    no_retriever = ("its offline Wikipedia holds only the pages ReAct's released trajectories opened, and its "
                    "stand-in teacher replays their exact-title searches")

    def load_questions(self, name: str, limit: int | None = None) -> list[Claim]:
        return load_question_set(name, limit)

    def normalize(self, answer: str | None) -> str:
        return normalize_answer(answer or "")  # FeverWrapper normalises with HotpotQA's function

    def scores(self, prediction: str | None, gold: str) -> dict[str, float]:
        correct = float(prediction is not None and self.normalize(prediction) == self.normalize(gold))
        return {"em": correct, "f1": correct}

    # The released prompts carry their own instruction line ("Determine if there is Observation
    # that SUPPORTS or REFUTES a Claim, ..."): nothing goes before them (Task.paper_instruction).

    def reference_rows(self) -> list[dict]:
        from pipeline.report.references import fever_reference_rows

        return fever_reference_rows()

    def lacks_pages(self, question: Claim, has_page: Any) -> bool | None:
        # FEVER's claims name no pages; ReAct's released trajectory of a claim shows what it searched
        # (some searches missed in 2022 too, so any one page found is enough)
        from pipeline.tasks.fever.replay import searched_titles

        released = local_trajectories().get(question.index)
        if released is None or released.claim != question.question:  # another file's claim at that line
            return None
        titles = searched_titles(released)
        return not any(has_page(t) for t in titles) if titles else None

    def oracle(self, fmt: str, settings: Any, style: str) -> Any:
        from pipeline.tasks.fever.replay import replay_method

        return replay_method(fmt, settings, style)

    def question_facts(self, question: Claim) -> dict[str, Any]:
        return {"split": question.split, "label": question.answer, "source": question.source}

    def describe(self, question: Claim) -> str:
        return f"- {question.id} (line {question.index}) {question.question}\n  label: {question.answer}"


TASK = Fever()
