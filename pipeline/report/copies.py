"""Answers copied from the prompt's exemplars: how much of a prompted model's EM is an exemplar's
own answer said again. A small prompted model often ends every episode with the answer of the
exemplar nearest the question (the last one), whatever it read: with the paper's exemplars,
whose last answer is "yes", that scores on every yes question it meets. This table says, per
method of a prompted eval folder: how many predictions are the last exemplar's answer, how many
are any exemplar's answer, how many of those were right, and the EM left without them.

    python -m pipeline.report.copies runs/<experiment>/eval/<model>-prompt [more eval folders]
    python -m pipeline.report.copies runs/<experiment>/generate      # a prompted teacher's episodes

A prediction counts as a copy when it matches an exemplar's answer by the task's own exact match
(HotpotQA's normalisation: case, articles, punctuation), the same test the gold answer gets.
"""

from __future__ import annotations

import argparse
import re
import sys
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
class Copies:
    method: str
    n: int
    right: int  # EM = 1
    last: str  # the last exemplar's answer
    as_last: int  # predictions that are the last exemplar's answer
    as_last_right: int
    as_any: int  # predictions that are any exemplar's answer (the last included)
    as_any_right: int

    @property
    def right_without_copies(self) -> int:
        return self.right - self.as_any_right


def count_copies(records: list[dict], answers: list[str], task: Task, method: str) -> Copies:
    """The copies among one method's records, against its prompt's exemplar answers."""
    if not answers:
        raise PipelineError(f"{method}: its exemplars hold no answer to compare with")

    def matches(prediction: str | None, answer: str) -> bool:
        return prediction is not None and task.scores(prediction, answer)["em"] == 1.0

    last = [r for r in records if matches(r.get("prediction"), answers[-1])]
    any_ = [r for r in records if any(matches(r.get("prediction"), a) for a in answers)]
    return Copies(method, len(records), sum(r["em"] == 1.0 for r in records), answers[-1],
                  len(last), sum(r["em"] == 1.0 for r in last), len(any_), sum(r["em"] == 1.0 for r in any_))


def folder_copies(folder: Path) -> list[Copies]:
    """Each method of one prompted eval folder, or of a generate folder of a prompted teacher (its
    manifest says the exemplars, the search mode and the task)."""
    from pipeline.methods import FORMATS_USED
    from pipeline.methods.prompts import load_prompt

    manifest = require_complete(folder / "manifest.json", f"eval or generate folder {folder}")
    config = manifest.get("config") or {}
    if not prompted_with_exemplars(manifest):
        raise PipelineError(f"{folder}: not a prompted model's eval or generate run; only a prompted one has "
                            "exemplars to copy")
    task = get_task(manifest.get("task"))
    exemplars = config["prompting"]["exemplars"]
    search = (config.get("wiki") or {}).get("search", "title")
    out = []
    for method in config["methods"]:
        path = folder / f"{method}.jsonl"
        if not path.is_file():
            raise PipelineError(f"{path}: no records of {method}; the folder's manifest lists it")
        prefix = load_prompt(FORMATS_USED[method][-1], exemplars, task=task, search=search)
        out.append(count_copies(read_jsonl(path), exemplar_answers(prefix.exemplars), task, method))
    return out


def prompted_with_exemplars(manifest: dict) -> bool:
    """An eval of a prompted model, or a generate run whose teacher is a model prompted few-shot
    (not the oracle stand-in, not zero-shot)."""
    config = manifest.get("config") or {}
    if manifest.get("stage") == "generate":
        return config.get("oracle") is None and (config.get("prompting") or {}).get("style") == "prompt"
    return manifest.get("mode") == "prompt"


def copies_markdown(rows: list[tuple[str, Copies]]) -> str:
    lines = ["| eval | method | n | EM % | last exemplar's answer | said as the answer | of them right | "
             "any exemplar's answer | of them right | EM % without copies |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for name, c in rows:
        lines.append(f"| {name} | {c.method} | {c.n} | {100 * c.right / c.n:.1f} | {c.last} | {c.as_last} | "
                     f"{c.as_last_right} | {c.as_any} | {c.as_any_right} | {100 * c.right_without_copies / c.n:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report.copies", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="eval folders of prompted models, or generate folders of prompted teachers (each with manifest.json)")
    args = parser.parse_args(argv)

    def report() -> int:
        rows = [(folder.name, c) for folder in args.folders for c in folder_copies(folder)]
        print(copies_markdown(rows), end="")
        return 0

    return one_line_errors(report)


if __name__ == "__main__":
    sys.exit(main())
