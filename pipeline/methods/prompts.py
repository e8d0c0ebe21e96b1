"""Few-shot prompt prefixes: an instruction plus the task's exemplars per trajectory format.

Two exemplar sources, each the task's (pipeline.tasks):
  - "ours": the project's own 6 HotpotQA exemplars per format (pipeline/methods/exemplars/),
    written from offline-bootstrap questions, with observations produced by our WikiEnv over the
    local index, rendered by pipeline.core.trajectory (so they read exactly like our training data);
    FEVER has none;
  - "paper": the ReAct paper's released exemplars, used verbatim, from a path or through the data
    resolver: HotpotQA's `prompts_naive.json` (keys webthink_simple6 / webact_simple6 /
    cotqa_simple6 / webqa_simple6; `python -m pipeline data fetch prompts`), FEVER's `fever.json`
    (the *_simple3 keys, 3 exemplars each; `python -m pipeline data fetch fever-prompts`).
Zero-shot mode ("none") has no prefix at all: a fine-tuned student sees the question line alone.
In the bm25 search mode (wiki.search=bm25) "ours" and "paper" name that mode's sets, built by
pipeline.methods.build_exemplars into the task's exemplar_dir / "bm25": ours replayed through the
retriever, and the paper's ReAct / Act exemplars with their observations replayed (`paper.json`).

    python -c "from pipeline.methods.prompts import load_prompt; print(load_prompt('react').prefix)"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import read_json
from pipeline.core.trajectory import FORMATS, Trajectory, render
from pipeline.tasks import Task

NAMED_EXEMPLARS = ("ours", "paper")  # the sets known by name (load_prompt also reads a path)


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


def exemplar_dir(task: Task, search: str = "title") -> Path:
    """Where the task's exemplars of ours for a wiki.search mode are (title: exemplar_dir itself)."""
    return Path(task.exemplar_dir) if search == "title" else Path(task.exemplar_dir) / search


def paper_replay_file(directory: Path) -> Path:
    """The paper's exemplars with observations replayed in a search mode (build_exemplars writes it)."""
    return Path(directory) / "paper.json"


def our_exemplar_file(fmt: str, directory: Path) -> Path:
    return Path(directory) / f"{fmt}.json"


def load_our_exemplars(fmt: str, directory: str | Path) -> list[dict]:
    """Our exemplar records in `directory` (a task's `exemplar_dir`): {id, gold_answer, trajectory
    (Trajectory.to_dict())}."""
    _check_format(fmt)
    path = our_exemplar_file(fmt, Path(directory))
    if not path.is_file():
        raise PipelineError(f"{path}: exemplar file missing; regenerate it with "
                            "`python -m pipeline.methods.build_exemplars --write`")
    records = read_json(path)
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or "trajectory" not in rec:
            raise PipelineError(f"{path}: exemplar {i} has no 'trajectory'")
        traj = rec["trajectory"]
        found = traj.get("format", traj.get("method"))  # "method": files written before the rename
        if found != fmt:
            raise PipelineError(f"{path}: exemplar {i} is a {found!r} "
                                f"trajectory in the {fmt!r} file")
    return records


def our_prefix(fmt: str, directory: str | Path | None = None, task: Task | str | None = None,
               search: str = "title") -> PromptPrefix:
    """Our exemplars of `fmt` from `directory` (default: the task's own for the search mode;
    HotpotQA's by default)."""
    from pipeline.tasks import get_task

    task = get_task(task)
    if "ours" not in task.exemplar_sets:
        raise PipelineError(f"the {task.title} task has no exemplars of ours; set prompting.exemplars=paper")
    instruction = task.our_instruction(fmt)
    directory = directory if directory is not None else exemplar_dir(task, search)
    records = load_our_exemplars(fmt, directory)
    text = "".join(render(Trajectory.from_dict(r["trajectory"])).text for r in records)
    return PromptPrefix(fmt, instruction, text, f"ours:{Path(directory)}")


def paper_prefix(fmt: str, path: str | Path | None = None, task: Task | str | None = None,
                 search: str = "title") -> PromptPrefix:
    """The paper's exemplars for `fmt` in the task's release (HotpotQA's by default), verbatim,
    from `path` (its prompts_naive.json / fever.json) or, when None, the file the data resolver
    finds (project cache, local mirror, or a download); in another search mode, with the
    observations replayed in it (`paper_replay_file`, written by build_exemplars)."""
    from pipeline.core.paths import SOURCES, resolve_source
    from pipeline.tasks import get_task

    _check_format(fmt)
    task = get_task(task)
    source = SOURCES[task.paper_prompts]
    if path is None and search != "title":
        path = paper_replay_file(exemplar_dir(task, search))
        if not path.is_file():
            raise PipelineError(f"{path}: the paper's exemplars replayed in wiki.search={search} are missing; build "
                                f"them with `python -m pipeline.methods.build_exemplars --index INDEX --search {search} --write`")
    if path is None:
        path = resolve_source(task.paper_prompts)
    path = Path(path)
    file_name = Path(source.mirror_relpath).name
    if not path.is_file():
        raise PipelineError(f"{path}: exemplar file not found; give a {file_name} path or "
                            f"run `{source.fetch_command}`")
    prompts = read_json(path)
    key = task.paper_keys[fmt]
    if not isinstance(prompts, dict) or not isinstance(prompts.get(key), str):
        raise PipelineError(f"{path}: no '{key}' exemplars (expected the ReAct {file_name} "
                            f"format with keys {', '.join(task.paper_keys.values())})")
    # The paper's text starts with a newline for ReAct and ends with one or two: keep one at the
    # end so the question line starts a line of its own, as in the original prompts.
    exemplars = prompts[key].rstrip("\n") + "\n"
    return PromptPrefix(fmt, task.paper_instruction(fmt), exemplars, f"paper:{path}#{key}")


def load_prompt(fmt: str, exemplars: str = "ours", task: Task | str | None = None,
                search: str = "title") -> PromptPrefix:
    """`exemplars`: "ours", "paper", "none" (zero-shot), a file of the paper's exemplars
    (prompts_naive.json, fever.json), or a folder holding our exemplar files (<format>.json).
    `task`: a pipeline.tasks name or Task (default HotpotQA); `search`: the wiki.search mode,
    whose own sets "ours" and "paper" name."""
    _check_format(fmt)
    if exemplars == "ours":
        return our_prefix(fmt, task=task, search=search)
    if exemplars == "paper":
        return paper_prefix(fmt, task=task, search=search)
    if exemplars in ("none", "zero-shot", "zero_shot"):
        return zero_shot(fmt)
    path = Path(exemplars).expanduser()
    if path.is_dir():
        return our_prefix(fmt, path, task)
    if path.is_file():
        return paper_prefix(fmt, path, task)
    raise PipelineError(f"exemplars '{exemplars}': not 'ours', 'paper', 'none', a file of the paper's "
                        "exemplars or a folder of exemplar files")


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise PipelineError(f"unknown trajectory format '{fmt}'; expected one of {', '.join(FORMATS)}")
