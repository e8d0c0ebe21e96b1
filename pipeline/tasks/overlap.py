"""Questions trained on and questions evaluated on, kept apart: a fine-tuned score (or a GRPO
held-out curve) over questions the student trained on measures recall, not the method. The
grid's bootstrap set, the self-training rounds' and GRPO's training questions are each compared
with the evaluation sets of what they train; GRPO's held-out set with its training questions.

    overlap(task, ("offline-bootstrap", 48), ("offline-eval", 16))   # None: apart
    overlap(task, ("dev", None), ("react-dev500", None))             # 'shares 500 of its 500 questions with dev'

Sets are compared by their questions' text (ids differ between a set's sources: `dev:<index>`
against HotpotQA's own ids), each cut to its `limit`. A set fetched from the hub (`hf:...`) is
compared by name only, so that a plan downloads nothing; so is a set not on this machine yet
(said in a note).
"""

from __future__ import annotations

import sys

from pipeline.core.errors import PipelineError
from pipeline.tasks.base import Task

KEY = "allow_question_overlap"  # the config key that says an overlap is meant


def overlap(task: Task, trained: tuple[str, int | None], evaluated: tuple[str, int | None]) -> str | None:
    """How the `evaluated` set (name, limit) meets the `trained` one, in words; None when apart."""
    (t_name, t_limit), (e_name, e_limit) = trained, evaluated
    if str(t_name) == str(e_name):
        return "is the training set itself"  # both take its first questions
    if any(str(name).startswith("hf:") for name in (t_name, e_name)):
        return None
    try:
        seen = {text(q.question) for q in task.load_questions(str(t_name), limit=t_limit)}
        evaluated_questions = task.load_questions(str(e_name), limit=e_limit)
    except PipelineError:  # a set not on this machine yet: its phase reads it (or says why it cannot)
        print(f"note: questions {t_name} and {e_name} compared by name only: one of them is not readable here "
              "yet (it is read when its phase starts)", file=sys.stderr)
        return None
    shared = sum(text(q.question) in seen for q in evaluated_questions)
    return f"shares {shared} of its {len(evaluated_questions)} questions with the training set ({t_name})" if shared else None


def check_apart(task: Task, trained: tuple[str, int | None], evaluated: tuple[str, int | None],
                what: str, allowed: bool) -> None:
    """Refuse `evaluated` meeting `trained` (what: how the two are used, for the message) unless
    `allowed` (the KEY's value)."""
    if allowed:
        return
    shared = overlap(task, trained, evaluated)
    if shared:
        raise PipelineError(f"{what}={evaluated[0]} {shared}: a score over questions trained on measures recall; "
                            f"choose apart sets (e.g. offline-bootstrap to train, offline-eval to evaluate), or set "
                            f"{KEY}=true if this is meant")


def text(question: str) -> str:
    return " ".join(question.lower().split())
