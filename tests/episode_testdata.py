"""Shared by the generate / eval / crash / security tests: a real local index, question files,
a scripted teacher behind the fake OpenAI-compatible server, and a `python -m pipeline` runner.

Not a test module (no test_ prefix): `from episode_testdata import ...` from tests/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "wiki" / "corpus.jsonl"
EPISODE_FIELDS = {"id", "question", "gold_answer", "method", "teacher", "prediction", "em", "f1",
                  "finished", "end_reason", "n_steps", "steps", "trajectory", "text",
                  "prompt_tokens", "completion_tokens", "seconds", "source"}
SUMMARY_FIELDS = {"model", "size_class", "params_b", "mode", "method", "question_set", "n", "em",
                  "f1", "finish_rate", "errors", "mean_steps", "prompt_tokens", "completion_tokens",
                  "seconds", "source", "precision", "train_precision", "search"}
TIMING_FIELDS = ("seconds",)


def build_full_index(path: Path) -> Path:
    """The whole offline corpus (26k pages) as a real SQLite index (~1-2 s)."""
    from pipeline.wiki.index import build_index

    build_index([CORPUS], path)
    return path


def build_small_index(folder: Path, pages: list[dict]) -> Path:
    """`pages` ({title, sentences} rows) written as a corpus file in `folder` and built into a
    real SQLite index there; returns the index path."""
    from pipeline.wiki.index import build_index

    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in pages), encoding="utf-8")
    return build_index([corpus], folder / "wiki.sqlite").out


def write_questions(path: Path, questions: list, ids: list[str] | None = None) -> Path:
    """A JSONL file of official-format records (optionally with other ids)."""
    with open(path, "w", encoding="utf-8") as fh:
        for i, q in enumerate(questions):
            rec = {"_id": ids[i] if ids else q.id, "question": q.question, "answer": q.answer,
                   "type": q.type, "supporting_facts": q.supporting_facts, "context": q.context}
            fh.write(json.dumps(rec) + "\n")
    return path


def run_pipeline(*args: str, env: dict | None = None, timeout: float = 120,
                 cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m pipeline <args>` as a real subprocess."""
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=child_env(env),
                          capture_output=True, text=True, timeout=timeout)


def child_env(extra: dict | None = None) -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "TQDM_DISABLE": "1", **(extra or {})}


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}


# -- a scripted teacher behind FakeOpenAI ------------------------------------------------------

_QUESTION = re.compile(r"^Question: (.*)$", re.M)
_CUE = re.compile(r"(Thought|Action) (\d+):$")


class ScriptedTeacher(dict):
    """`FakeOpenAI.replies`, computed from the prompt: a deterministic teacher that searches the
    first gold title and then finishes with the gold answer, in the format the prompt asks for.
    Questions are found by the last `Question:` line of the prompt (exemplars come before it)."""

    def __init__(self, questions: list, answers: dict[str, str] | None = None):
        super().__init__()
        from pipeline.core.trajectory import one_line

        # keyed by the question as prompts carry it (one line, as the renderer writes it)
        self.by_text = {one_line(q.question): q for q in questions}
        self.answers = {one_line(k): v for k, v in (answers or {}).items()}  # default: the gold answer
        self.prompts: list[str] = []

    def get(self, prompt, default=None):
        self.prompts.append(prompt)
        text = _QUESTION.findall(prompt)[-1]
        q = self.by_text[text]
        answer = self.answers.get(text, q.answer)
        title = q.gold_titles[0] if q.gold_titles else text
        tail = prompt.rstrip("\n").splitlines()[-1]
        if tail.endswith("Answer:"):  # standard
            return [f" {answer}"]
        if tail.endswith("Thought:"):  # cot
            return [f" Let's think step by step. {title} tells me. \nAnswer: {answer}"]
        kind, step = _CUE.search(tail).groups()
        step = int(step)
        action = f"Search[{title}]" if step == 1 else f"Finish[{answer}]"
        if kind == "Action":  # act (or the re-ask for a missing ReAct action)
            return [f" {action}"]
        return [f" I need step {step}.\nAction {step}: {action}\nObservation {step}: invented"]
