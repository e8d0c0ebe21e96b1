"""k sampled episodes per question (rejection sampling: `generate samples=k` with
`prompting.temperature` > 0, kept by `filter` if correct), and which questions a run solved.

    questions = expand(questions, 4)        # each question 4 times, as samples q#0 .. q#3
    solved = solved_questions(records, task)

Record identity: with one episode per question (samples=1, the default) a record's `id` is the
question's, as always. With k > 1 each episode is one sample `<question id>#<j>` (j = 0..k-1):
that is its record `id` (resume, dedup and the episode's request seeds go by it, so every sample
draws its own tokens and a resumed run draws the same ones), and the record carries
`question_id` and `sample` too. Everything that counts questions reads `question_id(record)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SEPARATOR = "#"  # between a question's id and a sample's number; question ids never hold it


class Sample:
    """Sample `index` of a question: the question itself (its text, answer, gold facts) under the
    id `<question id>#<index>`."""

    def __init__(self, question: Any, index: int):
        self.question_of, self.sample = question, index
        self.question_id = str(question.id)
        self.id = f"{self.question_id}{SEPARATOR}{index}"

    def __getattr__(self, name: str) -> Any:  # question, answer, supporting_facts, ...
        if name == "question_of":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.question_of, name)


def expand(questions: list, samples: int) -> list:
    """Each question `samples` times, as Samples, question by question (samples=1: unchanged)."""
    if samples == 1:
        return list(questions)
    return [Sample(q, j) for q in questions for j in range(samples)]


def question_id(record: dict) -> str:
    """The question a record answered (a sample's `question_id`, else its own id)."""
    return str(record.get("question_id") or record["id"])


def question_of_row(row: dict) -> str:
    """The question an SFT dataset row answered: rows keep the episode's `id` only, so a sample's
    `<question id>#<j>` is cut at the separator (question ids never hold it)."""
    return str(row.get("question_id") or row["id"]).split(SEPARATOR)[0]


def record_fields(question: Any) -> dict:
    """What an episode record adds for a sampled question: its question id and sample number."""
    if isinstance(question, Sample):
        return {"question_id": question.question_id, "sample": question.sample}
    return {}


def solved_questions(records: Iterable[dict], task: Any) -> set[str]:
    """The questions at least one of `records` answered correctly (finished, and correct by the
    task's rule: what filter keeps)."""
    return {question_id(r) for r in records if r.get("finished") and task.is_correct(r)}
