"""Answers said again: how much of a model's EM is one answer repeated. A small prompted model
often ends every episode with the answer of the exemplar nearest the question (the last one),
whatever it read: with the paper's exemplars, whose last answer is "yes", that scores on every yes
question it meets; a student trained on such a teacher's right episodes may say yes to all. This
table says, per method of an eval or generate folder: the answer said most (any folder: a
fine-tuned student collapsed onto one answer shows there), and where the prompts carried exemplars
how many predictions are the last exemplar's answer, how many are any exemplar's answer, how many
of those were right, and the EM left without them.

    python -m pipeline.report.copies runs/<experiment>/eval/<model>-prompt [more eval folders]
    python -m pipeline.report.copies runs/<experiment>/generate      # a teacher's episodes

A prediction counts as a copy when it matches an exemplar's answer in the form the task compares
answers in (`Task.normalize`, HotpotQA's: case, articles, punctuation), the test its exact match
puts the gold answer to; the answer said most is counted in the same form.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError, one_line_errors
from pipeline.core.storage import read_jsonl, require_complete
from pipeline.tasks import Task, get_task

# Where an exemplar ends in its answer: Finish[...] in the interactive formats, "Answer: ..." in
# Standard and CoT (RAG prompts with Standard's exemplars)
_FINISH = re.compile(r"Finish\[(.*?)\]")
_ANSWER = re.compile(r"^Answer: (.*)$", re.MULTILINE)


def exemplar_answers(exemplars_text: str) -> list[str]:
    """The exemplars' answers in prompt order (the last is the one next to the question)."""
    found = sorted([(m.start(), m.group(1).strip()) for pattern in (_FINISH, _ANSWER)
                    for m in pattern.finditer(exemplars_text)])
    return [answer for _, answer in found]


@dataclass(frozen=True)
class Said:
    """One answer and how often a method's records said it."""

    answer: str
    times: int
    right: int  # of those, EM = 1


@dataclass(frozen=True)
class Copies:
    method: str
    n: int
    right: int  # EM = 1
    most: Said | None  # the answer said most (a fine-tuned student collapsed onto one shows here too)
    last_exemplar: Said | None  # the last exemplar's answer (None: no exemplars in its prompts)
    any_exemplar: Said | None  # any exemplar's answer, the last included

    @property
    def right_without_copies(self) -> int:
        return self.right - (self.any_exemplar.right if self.any_exemplar else 0)


def count_copies(records: list[dict], answers: list[str], task: Task, method: str) -> Copies:
    """The copies among one method's records, against its prompts' exemplar answers (none: a
    zero-shot student's or the stand-in's records, whose answer said most is still counted)."""

    def said(answer: str, hits: list[dict]) -> Said:
        return Said(answer, len(hits), sum(r["em"] == 1.0 for r in hits))

    # each prediction in the form the task compares answers in (its exact match), once
    by_answer: dict[str, list[dict]] = defaultdict(list)  # normalised answer -> its records, first seen first
    for r in records:
        if r.get("prediction") is not None:
            by_answer[task.normalize(r["prediction"])].append(r)
    most = None
    if by_answer:
        hits = max(by_answer.values(), key=len)  # a tie: the answer seen first
        most = said(hits[0]["prediction"], hits)
    last = any_ = None
    if answers:
        last = said(answers[-1], by_answer.get(task.normalize(answers[-1]), []))
        exemplars = dict.fromkeys(task.normalize(a) for a in answers)  # two exemplars may share an answer
        any_ = said("any", [r for key in exemplars for r in by_answer.get(key, [])])
    return Copies(method, len(records), sum(r["em"] == 1.0 for r in records), most, last, any_)


def folder_copies(folder: Path) -> list[Copies]:
    """Each method of an eval or generate folder (its manifest says the exemplars, the search mode
    and the task); the exemplar columns only where a model was prompted with exemplars."""
    from pipeline.methods import FORMATS_USED
    from pipeline.methods.prompts import load_prompt

    manifest = require_complete(folder / "manifest.json", f"eval or generate folder {folder}")
    config = manifest.get("config") or {}
    task = get_task(manifest.get("task"))
    search = (config.get("wiki") or {}).get("search", "title")
    out = []
    for method in config.get("methods") or []:
        path = folder / f"{method}.jsonl"
        if not path.is_file():
            raise PipelineError(f"{path}: no records of {method}; the folder's manifest lists it")
        answers = []
        if prompted_with_exemplars(manifest):
            prefix = load_prompt(FORMATS_USED[method][-1], config["prompting"]["exemplars"], task=task, search=search)
            answers = exemplar_answers(prefix.exemplars)
        out.append(count_copies(read_jsonl(path), answers, task, method))
    if not out:
        raise PipelineError(f"{folder}: its manifest lists no method; is it an eval or generate folder?")
    return out


def prompted_with_exemplars(manifest: dict) -> bool:
    """An eval of a prompted model, or a generate run whose teacher is a model prompted few-shot
    (not the oracle stand-in, not zero-shot)."""
    config = manifest.get("config") or {}
    if manifest.get("stage") == "generate":
        return config.get("oracle") is None and (config.get("prompting") or {}).get("style") == "prompt"
    return manifest.get("mode") == "prompt"


def copies_markdown(rows: list[tuple[str, Copies]]) -> str:
    def cell(said: Said | None, named: bool = True) -> str:
        return "– | –" if said is None else f"{f'{said.answer!r} ' if named else ''}{said.times} | {said.right}"

    def share(count: int, n: int) -> str:
        return f"{100 * count / n:.1f}" if n else "–"

    lines = ["| run | method | n | EM % | the answer said most: times | of them right | "
             "the last exemplar's answer: times | of them right | any exemplar's answer: times | of them right | "
             "EM % without copies |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in rows:
        without = "–" if c.any_exemplar is None else share(c.right_without_copies, c.n)
        lines.append(f"| {name} | {c.method} | {c.n} | {share(c.right, c.n)} | {cell(c.most)} | "
                     f"{cell(c.last_exemplar)} | {cell(c.any_exemplar, named=False)} | {without} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report.copies", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="eval or generate folders (each with manifest.json)")
    args = parser.parse_args(argv)

    def report() -> int:
        rows = [(folder.name, c) for folder in args.folders for c in folder_copies(folder)]
        print(copies_markdown(rows), end="")
        return 0

    return one_line_errors(report)


if __name__ == "__main__":
    sys.exit(main())
