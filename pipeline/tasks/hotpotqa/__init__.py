"""HotpotQA (Yang et al. 2018), the task of the paper's figure 3: multi-hop questions, free-text
answers, exact match (and token F1) after the official normalisation.

    task = get_task("hotpotqa")
    task.load_questions("offline-eval")      # pipeline.tasks.hotpotqa.questions: every file format, the named sets
    task.scores("the Eiffel Tower", "Eiffel Tower")   # {"em": 1.0, "f1": 1.0} (pipeline.tasks.hotpotqa.metric)

Its instructions and the keys of the paper's exemplars are here, its other pieces beside them:
questions.py (every file format, the named sets), split.py (the offline split, `data split`),
metric.py (the official EM / F1; evaluate_metric.py wraps it for Hugging Face `evaluate`),
oracle.py (the stand-in teacher that writes trajectories from the gold facts); our exemplars are
in pipeline/methods/exemplars/. This class is what the rest of the pipeline sees of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.tasks.base import Task
from pipeline.tasks.hotpotqa import metric, questions

# Our 6 exemplars per format (pipeline/methods/build_exemplars.py writes them), and the keys of
# the paper's in prompts_naive.json.
EXEMPLAR_DIR = Path(__file__).resolve().parents[2] / "methods" / "exemplars"
PAPER_KEYS = {"react": "webthink_simple6", "act": "webact_simple6", "cot": "cotqa_simple6",
              "standard": "webqa_simple6"}

# Our own wording of the task description that precedes the exemplars (same content as the
# paper's: what each action does).
_ACTIONS = (
    "(1) Search[entity] searches Wikipedia for the exact entity and returns the first paragraph "
    "of its page if there is one; otherwise it lists similar entities to search instead.\n"
    "(2) Lookup[keyword] returns the next sentence of the current page that contains the keyword.\n"
    "(3) Finish[answer] gives the answer and ends the task.\n"
)
# hotpotqa.ipynb's `instruction`, verbatim (trailing space on the first line included): the
# prefix of the paper's ReAct exemplars. The release has no instruction for the other formats,
# so they keep ours.
NOTEBOOK_INSTRUCTION = (
    "Solve a question answering task with interleaving Thought, Action, Observation steps. "
    "Thought can reason about the current situation, and Action can be three types: \n"
    "(1) Search[entity], which searches the exact entity on Wikipedia and returns the first "
    "paragraph if it exists. If not, it will return some similar entities to search.\n"
    "(2) Lookup[keyword], which returns the next sentence containing keyword in the current passage.\n"
    "(3) Finish[answer], which returns the answer and finishes the task.\n"
    "Here are some examples.\n"
)
INSTRUCTIONS = {
    "react": "Answer a question by interleaving Thought, Action and Observation steps. A Thought "
             "reasons about the situation so far; an Action is one of three kinds:\n" + _ACTIONS
             + "Here are some examples.\n",
    "act": "Answer a question by taking Action steps, each followed by its Observation. An Action "
           "is one of three kinds:\n" + _ACTIONS + "Here are some examples.\n",
    "cot": "Answer a question by thinking step by step, then giving the answer. Here are some "
           "examples.\n",
    "standard": "Answer a question directly. Here are some examples.\n",
}


class HotpotQA(Task):
    name = "hotpotqa"
    title = "HotpotQA"
    question_label = "Question"
    metric_label = "EM"
    correct_rule = "exact match 1"
    question_sets = questions.QUESTION_SETS
    hybrid_react_steps = None  # 7, the paper's and prompting.max_steps's default
    paper_prompts = "react-prompts"
    paper_keys = PAPER_KEYS
    exemplar_dir = EXEMPLAR_DIR
    citation = "HotpotQA (Yang et al. 2018)"
    licence = "CC BY-SA 4.0"
    hub_dataset = "hotpotqa/hotpot_qa"
    oracle_source = "oracle (gold supporting facts)"
    oracle_sets = ("offline-eval", "offline-bootstrap", "dev", "train", "hf:<distractor|fullwiki>:<train|validation>")
    oracle_needs = "gold supporting facts"
    states_orderings = True

    def load_questions(self, name: str, limit: int | None = None) -> list[questions.Question]:
        return questions.load_question_set(name, limit=limit)

    def oracle_lacks(self, question: questions.Question) -> bool:
        return not question.supporting_facts  # react-dev500's: the paper's sample carries none

    def lacks_pages(self, question: questions.Question, has_page: Any) -> bool | None:
        # its gold pages, every one: a question is answered from two of them
        return not all(has_page(t) for t in question.gold_titles) if question.gold_titles else None

    def normalize(self, answer: str | None) -> str:
        return metric.normalize_answer(answer or "")

    def scores(self, prediction: str | None, gold: str) -> dict[str, float]:
        if prediction is None:
            return {"em": 0.0, "f1": 0.0}
        return {"em": metric.exact_match(prediction, gold), "f1": metric.f1_score(prediction, gold)}

    def paper_instruction(self, fmt: str) -> str:
        # hotpotqa.ipynb's instruction precedes the paper's ReAct exemplars; the release has none
        # for the other formats, so they keep ours.
        return NOTEBOOK_INSTRUCTION if fmt == "react" else INSTRUCTIONS[fmt]

    def our_instruction(self, fmt: str) -> str:
        return INSTRUCTIONS[fmt]

    def reference_rows(self) -> list[dict]:
        from pipeline.report.references import reference_rows

        return reference_rows()

    def oracle(self, fmt: str, settings: Any, style: str) -> Any:
        from pipeline.tasks.hotpotqa.oracle import oracle_method

        return oracle_method(fmt, settings, style)

    def write_split(self, out: Path | None, *, questions: Path | None, corpus: Path | None, seed: int,
                    eval_size: int) -> str:
        from pipeline.tasks.hotpotqa.split import write_offline_split

        return write_offline_split(out, questions=questions, corpus=corpus, seed=seed, eval_size=eval_size)

    def question_facts(self, question: questions.Question) -> dict[str, Any]:
        return {"split": question.split, "type": question.type, "level": question.level,
                "context": "yes" if question.context is not None else "no", "source": question.source}

    def describe(self, question: questions.Question) -> str:
        gold = f"  gold: {question.gold_titles}" if question.supporting_facts else ""
        return f"- {question.id} [{question.type}] {question.question}\n  answer: {question.answer}{gold}"


TASK = HotpotQA()
