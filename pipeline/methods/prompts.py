"""Few-shot prompt prefixes: an instruction plus 6 exemplars per trajectory format.

Two exemplar sources:
  - "ours": the project's own 6 HotpotQA exemplars per format (pipeline/methods/exemplars/),
    written from offline-bootstrap questions, with observations produced by our WikiEnv over the
    local index, rendered by pipeline.trajectory (so they read exactly like our training data);
  - "paper": the ReAct paper's `prompts_naive.json` (keys webthink_simple6 / webact_simple6 /
    cotqa_simple6 / webqa_simple6), used verbatim, from a path or through the data resolver
    (`python -m pipeline data fetch prompts`).
Zero-shot mode ("none") has no prefix at all: a fine-tuned student sees the question line alone.

    python -c "from pipeline.methods.prompts import load_prompt; print(load_prompt('react').prefix)"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.storage import read_json
from pipeline.trajectory import FORMATS, Trajectory, render

EXEMPLAR_DIR = Path(__file__).resolve().parent / "exemplars"
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


@dataclass(frozen=True)
class PromptPrefix:
    """What precedes the question line in every prompt of one trajectory format."""

    format: str  # standard | cot | act | react
    instruction: str
    exemplars: str  # the exemplars' text, each one "Question: ...\n..." ending in "\n"
    source: str  # "ours:<dir>", "paper:<file>#<key>" or "none" (zero-shot), for manifests

    @property
    def text(self) -> str:
        return self.instruction + self.exemplars


def zero_shot(fmt: str) -> PromptPrefix:
    """No instruction, no exemplars: the fine-tuned student's format (question line alone)."""
    _check_format(fmt)
    return PromptPrefix(fmt, "", "", "none")


def our_exemplar_file(fmt: str, directory: Path = EXEMPLAR_DIR) -> Path:
    return Path(directory) / f"{fmt}.json"


def load_our_exemplars(fmt: str, directory: str | Path = EXEMPLAR_DIR) -> list[dict]:
    """Our exemplar records: {id, gold_answer, trajectory (Trajectory.to_dict())}."""
    _check_format(fmt)
    path = our_exemplar_file(fmt, Path(directory))
    if not path.is_file():
        raise PipelineError(f"{path}: exemplar file missing; regenerate it with "
                            "`python -m pipeline.methods.build_exemplars --write`")
    records = read_json(path)
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or "trajectory" not in rec:
            raise PipelineError(f"{path}: exemplar {i} has no 'trajectory'")
        if rec["trajectory"].get("method") != fmt:
            raise PipelineError(f"{path}: exemplar {i} is a {rec['trajectory'].get('method')!r} "
                                f"trajectory in the {fmt!r} file")
    return records


def our_prefix(fmt: str, directory: str | Path = EXEMPLAR_DIR) -> PromptPrefix:
    records = load_our_exemplars(fmt, directory)
    text = "".join(render(Trajectory.from_dict(r["trajectory"])).text for r in records)
    return PromptPrefix(fmt, INSTRUCTIONS[fmt], text, f"ours:{Path(directory)}")


def paper_prefix(fmt: str, path: str | Path | None = None) -> PromptPrefix:
    """The paper's exemplars for `fmt`, verbatim, from `path` (a prompts_naive.json) or, when
    None, the file the data resolver finds (project cache, local mirror, or a download)."""
    _check_format(fmt)
    if path is None:
        from pipeline.paths import resolve_source

        path = resolve_source("react-prompts")
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: exemplar file not found; give a prompts_naive.json path or "
                            "run `python -m pipeline data fetch prompts`")
    prompts = read_json(path)
    key = PAPER_KEYS[fmt]
    if not isinstance(prompts, dict) or not isinstance(prompts.get(key), str):
        raise PipelineError(f"{path}: no '{key}' exemplars (expected the ReAct prompts_naive.json "
                            f"format with keys {', '.join(PAPER_KEYS.values())})")
    # The paper's text starts with a newline for ReAct and ends with one or two: keep one at the
    # end so the question line starts a line of its own, as in the original prompts.
    exemplars = prompts[key].rstrip("\n") + "\n"
    instruction = NOTEBOOK_INSTRUCTION if fmt == "react" else INSTRUCTIONS[fmt]
    return PromptPrefix(fmt, instruction, exemplars, f"paper:{path}#{key}")


def load_prompt(fmt: str, exemplars: str = "ours") -> PromptPrefix:
    """`exemplars`: "ours", "paper", "none" (zero-shot), a prompts_naive.json path, or a folder
    holding our exemplar files (<format>.json)."""
    _check_format(fmt)
    if exemplars == "ours":
        return our_prefix(fmt)
    if exemplars == "paper":
        return paper_prefix(fmt)
    if exemplars in ("none", "zero-shot", "zero_shot"):
        return zero_shot(fmt)
    path = Path(exemplars).expanduser()
    if path.is_dir():
        return our_prefix(fmt, path)
    if path.is_file():
        return paper_prefix(fmt, path)
    raise PipelineError(f"exemplars '{exemplars}': not 'ours', 'paper', 'none', a prompts_naive.json "
                        "file or a folder of exemplar files")


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise PipelineError(f"unknown trajectory format '{fmt}'; expected one of {', '.join(FORMATS)}")
