"""What a task owns, and nothing else: its questions and splits, the question line, its answer
space, its metric and what counts as correct, its exemplars, its stand-in teacher and its published
reference points (the original ReAct code's `wrappers.py`: one wrapper per task, around one
Wikipedia environment that knows only Search, Lookup and Finish).

The stages, the methods and the episode runner are given a task and ask it; the environment is
given only `task.scores` (the metric is injected, as DSPy's `BootstrapFinetune` takes one), so a
new task is a new subclass in its own folder plus one line in `pipeline.tasks.TASK_MODULES`.

    task = get_task("fever")
    task.score("not enough info", "NOT ENOUGH INFO")   # 1.0: the reward of a Finish, RL's reward too
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError

# How the stand-in teacher searches (a stage's `oracle` key): exact (gold titles as written) or
# agent (names as the question writes them). HotpotQA's oracle has both; FEVER's replay, exact only.
ORACLE_STYLES = ("exact", "agent")
DEFAULT_ORACLE_STYLE = "exact"
_PUNCT = set(string.punctuation)


def check_oracle_style(style: str) -> None:
    if style not in ORACLE_STYLES:
        raise PipelineError(f"oracle must be one of {', '.join(ORACLE_STYLES)}, not '{style}' "
                            "(exact: gold titles as written; agent: names as the question writes them)")


def normalize_answer(text: str) -> str:
    """HotpotQA's official answer normalisation (`hotpot_evaluate_v1.py`), which the original
    FeverWrapper uses for FEVER's labels too: lower-case, drop punctuation and the articles
    a/an/the, collapse whitespace."""
    text = (text or "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def in_sets(name: str, sets: tuple[str, ...]) -> bool:
    """Whether `name` is one of the named question `sets`, a pattern such as `hf:<...>` included."""
    return name in sets or any(name.startswith(s.split("<", 1)[0]) for s in sets if "<" in s)


class Task:
    name: str = ""  # the config value: `task: fever`
    title: str = ""  # how figures, cards and tables name it: "FEVER"
    question_label: str = "Question"  # the question line's first word: "Question: ..." / "Claim: ..."
    metric_label: str = "EM"  # what the records' `em` field means for this task: "EM" | "accuracy"
    correct_rule: str = "exact match 1"  # how cards state `is_correct`
    answer_space: tuple[str, ...] | None = None  # the closed set of answers, or None (free text)
    question_sets: tuple[str, ...] = ()  # the named sets `load_questions` knows (for messages)
    # ReAct's step limit inside the two hybrids (the paper: 7 for HotpotQA, 5 for FEVER); None:
    # `prompting.max_steps`, as for plain ReAct and Act.
    hybrid_react_steps: int | None = None
    # The paper's exemplars: a data source (pipeline.core.paths) and its key per trajectory format.
    paper_prompts: str = ""
    paper_keys: dict[str, str] = {}
    exemplar_dir: Path | None = None  # our own exemplars (`exemplars: ours`), if the task has any
    # Where the questions come from, for cards: "<citation>: <what>, <licence>"
    citation: str = ""  # "HotpotQA (Yang et al. 2018)"
    data_kind: str = "questions and answers"
    licence: str = ""  # "CC BY-SA 4.0"
    hub_dataset: str | None = None  # the questions on the Hugging Face hub, for card metadata
    oracle_source: str = ""  # what the stand-in teacher (a stage's `oracle: exact|agent`) reads, for manifests
    # The named sets whose every question the stand-in teacher can answer (patterns such as
    # `hf:<...>` included); () where it answers any set. What it reads of a question: oracle_needs.
    oracle_sets: tuple[str, ...] = ()
    oracle_needs: str = ""
    states_orderings: bool = False  # whether the paper states figure-3 orderings for this task
    # Why the bm25 search mode (wiki.search, pipeline/wiki/env.py) does not apply to this task,
    # or "" where it does
    no_retriever: str = ""

    def load_questions(self, name: str, limit: int | None = None) -> list[Any]:
        """A named question set (or a file): objects with `id`, `question`, `answer`."""
        raise NotImplementedError

    def check_question_set(self, name: str) -> None:
        """Refuse a question set this task does not know (not one of `question_sets`, a pattern
        such as `hf:<...>` included, nor a file) without reading or downloading it: a plan
        checks this before its phases run; `load_questions` then reads the set."""
        if in_sets(name, self.question_sets) or Path(name).expanduser().is_file():
            return
        hint = "" if Path(name).suffix == "" else f" ({name} is not a file)"
        raise PipelineError(f"unknown question set '{name}' of {self.title}{hint}; use one of "
                            f"{', '.join(self.question_sets)} or a path to a file of them")

    def check_search(self, mode: str) -> None:
        """Refuse a wiki.search mode this task's environment cannot take, in one line."""
        if mode != "title" and self.no_retriever:
            raise PipelineError(f"wiki.search={mode} does not apply to {self.title}: {self.no_retriever}; "
                                "use wiki.search=title")

    def oracle_lacks(self, question: Any) -> bool:
        """Whether the stand-in teacher lacks what it writes `question`'s trajectory from."""
        return False

    def check_oracle_questions(self, name: str, questions: list[Any] | None = None) -> None:
        """Refuse a question set the stand-in teacher cannot answer, in one line naming the sets it
        can: by name (a named set not in `oracle_sets`; a plan checks this before it loads a
        question), and question by question once `questions` are loaded (a file's too)."""
        if not self.oracle_sets:
            return
        lacking = [q for q in questions or [] if self.oracle_lacks(q)]
        if in_sets(name, self.question_sets) and not in_sets(name, self.oracle_sets):
            why = f"questions={name} has no {self.oracle_needs}"
        elif lacking:
            why = f"{len(lacking)} of the {len(questions)} questions of {name} have no {self.oracle_needs} (first: {lacking[0].id})"
        else:
            return
        raise PipelineError(f"the oracle teacher writes each trajectory from a question's {self.oracle_needs}, and {why}; "
                            f"use questions= one of {', '.join(self.oracle_sets)} (or a file with them), or a model")

    def lacks_pages(self, question: Any, has_page: Any) -> bool | None:
        """Whether a Wikipedia (`has_page(title)`) lacks what `question` is answered from; None
        where the task does not know the question's pages."""
        return None

    def normalize(self, answer: str | None) -> str:
        """The form in which two answers are compared (the CoT-SC vote too)."""
        raise NotImplementedError

    def scores(self, prediction: str | None, gold: str) -> dict[str, float]:
        """The record's `em` (1.0 when correct by this task's metric) and `f1` for one answer."""
        raise NotImplementedError

    def score(self, prediction: str | None, gold: str) -> float:
        """One answer's score: 1.0 when correct. A Finish's reward; a reward for RL."""
        return self.scores(prediction, gold)["em"] if prediction is not None else 0.0

    def is_correct(self, record: dict) -> bool:
        """Whether an episode record answered correctly: the one rule generate's target mode and
        filter keep trajectories by (each also asks that the episode finished)."""
        return float(record.get("em") or 0.0) == 1.0

    def data_line(self) -> str:
        """The questions' source and licence, as cards state it."""
        return f"{self.citation}: {self.data_kind}, {self.licence}"

    def paper_instruction(self, fmt: str) -> str:
        """What precedes the paper's exemplars of `fmt` (where the released text has none of its own)."""
        return ""

    @property
    def exemplar_sets(self) -> tuple[str, ...]:
        """The named exemplar sets it has: the paper's, and ours where it has a folder of them."""
        return ("ours", "paper") if self.exemplar_dir is not None else ("paper",)

    def our_instruction(self, fmt: str) -> str:
        """What precedes our own exemplars of `fmt` (a task with an `exemplar_dir` writes it)."""
        raise NotImplementedError(f"the {self.title} task has an exemplar_dir but no our_instruction")

    def reference_rows(self) -> list[dict]:
        """The published points as summary rows (pipeline.report.references), for plot."""
        return []

    def oracle(self, fmt: str, settings: Any, style: str) -> Any:
        """The stand-in teacher's episode program for `fmt` (labelled `teacher: oracle`)."""
        raise PipelineError(f"the {self.title} task has no stand-in teacher; use a language model as the teacher")

    def write_split(self, out: Path | None, *, questions: Path | None, corpus: Path | None, seed: int,
                    eval_size: int) -> str:
        """Build the task's offline eval / bootstrap split (`data split`); returns what it wrote."""
        raise PipelineError(f"the {self.title} task has no offline split to build; its question sets are its release's")

    def question_facts(self, question: Any) -> dict[str, Any]:
        """What `data show` counts about a question set."""
        return {"split": getattr(question, "split", None), "source": getattr(question, "source", None)}

    def describe(self, question: Any) -> str:
        """One question as `data show` prints it."""
        return f"- {question.id} {question.question}\n  answer: {question.answer}"

    def __repr__(self) -> str:
        return f"<task {self.name}>"
