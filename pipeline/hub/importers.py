"""Importers for released data: FireAct's fine-tuning trajectories and its eval runs.

FireAct (Chen et al. 2023, github.com/anchen1011/FireAct) released GPT-4 trajectories for
HotpotQA train questions in two layouts, and eval runs of its fine-tuned models on the ReAct
500-question dev sample:

  alpaca_format/<name>.json   [{instruction: question, input: "", output: "Thought: ...\\nAction: search[x]\\n..."}]
  gpt_format/<name>.jsonl     {messages: [user: question, assistant: "Thought: ...\\nAction: ...", user: "Observation: ...", ...]}
  trajs/<run>.json            {dev index: {reward, em, f1, gt, pred, prompt, traj}}

Their text differs from ours: unnumbered `Thought:/Action:/Observation:` lines, lowercase
`search[]`/`finish[]`, Google-search snippets as observations, `reward = True` on finish.
`read_fireact_trajectories` turns each into our episode record (pipeline.agent.scheduler.episode_record), numbered by the
one renderer, with capitalised actions and the observations kept verbatim; what does not map onto
Standard/CoT/Act/ReAct (Reflexion-style retries, malformed chats, other tasks) is skipped and
counted. `read_fireact_eval_run` turns an eval run into a summary row for the figure.

The same reader takes any .jsonl of chat `messages` with `tool_calls` (the messages layout,
pipeline/core/messages.py, which reads them): a row whose messages hold a tool call or a
`role: tool` turn is read as one, FireAct's text-in-chat rows as above. Its correctness is the
`finish` call's tool result (`Episode finished, reward = 1`) when the row has one, else the row's
`em`; a row with neither is skipped (`no_reward`). Its teacher is the row's `teacher`, its
source `messages:<folder>/<file>`; its questions are read as HotpotQA's, as FireAct's are.

    python -m pipeline.hub.importers trajectories ../shared/data/fireact/alpaca_format/hotpotqa.json -o fireact.jsonl
    python -m pipeline.hub.importers runs ../shared/data/fireact/trajs -o fireact_summary.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.messages import NotToolCalls, from_messages
from pipeline.core.storage import atomic_write_json, atomic_write_text, read_utf8
from pipeline.core.trajectory import Step, Trajectory, render
from pipeline.tasks import get_task

TEACHER = "gpt-4 (FireAct release)"
OBSERVATION_SOURCE = (
    "Google search snippets (FireAct's SerpAPI tool), kept verbatim; not the Wikipedia "
    "environment's observations"
)
EM_SOURCE = (
    "FireAct's recorded reward: gold answers are not in the release, so a trajectory ending in "
    "finish[...] with reward True/1 has em=1 and f1=1 by construction (0 for False/0)"
)
# Text FireAct's Reflexion runs insert before retrying; such a trajectory is not a plain format.
REFLEXION_MARKER = "let me do a reflection"
# A multitask file mixes HotpotQA with other tasks; its HotpotQA questions are the ones in these.
HOTPOTQA_FILES = ("hotpotqa.json", "hotpotqa_multimethod.json", "hotpotqa.jsonl", "hotpotqa_multimethod.jsonl")
ACTION_NAMES = {"search": "Search", "lookup": "Lookup", "finish": "Finish"}

_LABEL = re.compile(r"^(Thought|Action|Observation)(?: \d+)?:\s?(.*)$")
_ACTION = re.compile(r"^(\w+)\[(.*)\]$", re.DOTALL)
_FINISHED = re.compile(r"^Episode finished, reward = (True|False|1|0|1\.0|0\.0)\s*$")


class Skip(Exception):
    """A released trajectory that does not map onto our formats; `reason` is counted."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class ImportReport:
    """What an import saw, kept per method, and skipped per reason."""

    source: str
    seen: int = 0
    kept: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    incorrect: int = 0  # kept, but FireAct's reward says wrong (em=0): the filter drops them

    def to_dict(self) -> dict:
        return {"source": self.source, "seen": self.seen, "kept": dict(self.kept),
                "skipped": dict(self.skipped), "incorrect": self.incorrect}

    def line(self) -> str:
        kept = ", ".join(f"{m} {n}" for m, n in sorted(self.kept.items())) or "none"
        skipped = ", ".join(f"{r} {n}" for r, n in self.skipped.most_common()) or "none"
        return f"{self.source}: {self.seen} seen; kept {kept} ({self.incorrect} with reward 0); skipped {skipped}"


# ---------------------------------------------------------------- trajectories


def question_id(question: str) -> str:
    """FireAct has no HotpotQA ids: the id is a hash of the normalised question, so the same
    question in two files (alpaca and gpt, or two methods) dedups."""
    return "fireact-" + hashlib.sha1(" ".join(question.split()).lower().encode()).hexdigest()[:16]


def read_fireact_trajectories(path: str | Path, *, other_tasks: bool = False) -> tuple[list[dict], ImportReport]:
    """Episode records from one FireAct alpaca (.json) or gpt (.jsonl) file, with the report."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: FireAct file not found; expected alpaca_format/*.json or gpt_format/*.jsonl")
    source = f"fireact:{path.parent.name}/{path.name}"
    pairs = _read_pairs(path)
    task_filter = not (other_tasks or path.name.startswith("hotpotqa"))
    hotpot = None  # a multitask file's HotpotQA questions, read when its first FireAct row needs them
    multimethod = "multimethod" in path.name
    report = ImportReport(source)
    episodes = []
    for index, (question, text) in enumerate(pairs):
        report.seen += 1
        try:
            if isinstance(text, dict):  # a row of chat messages with tool calls
                episode = tool_calls_episode(text, path)
                report.kept[episode["method"]] += 1
                report.incorrect += episode["em"] == 0.0
                episodes.append(episode)
                continue
            if question is None:
                raise Skip("no_question")
            if task_filter:
                hotpot = _hotpotqa_questions(path) if hotpot is None else hotpot
                if question.strip() not in hotpot:
                    raise Skip("not_hotpotqa")
            episode = fireact_episode(question, text, source=source, multimethod=multimethod)
        except Skip as skip:
            report.skipped[skip.reason] += 1
            continue
        episode["fireact_index"] = index
        report.kept[episode["method"]] += 1
        report.incorrect += episode["em"] == 0.0
        episodes.append(episode)
    return episodes, report


def _read_pairs(path: Path) -> list[tuple[str | None, str | dict]]:
    """(question, trajectory text in FireAct's line format) per record, for either layout; a
    row of messages with tool calls comes as (None, the row)."""
    try:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in read_utf8(path).splitlines() if line.strip()]
            return [_gpt_pair(row, path, i) for i, row in enumerate(rows, 1)]
        rows = json.loads(read_utf8(path))
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(rows, list):
        raise PipelineError(f"{path}: expected a JSON list of {{instruction, input, output}} (FireAct alpaca format)")
    pairs = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "instruction" not in row or "output" not in row:
            raise PipelineError(f"{path}: record {i} lacks instruction/output; is this FireAct's alpaca format?")
        question = "\n".join(p for p in (row["instruction"], row.get("input") or "") if p)
        pairs.append((question, row["output"]))
    return pairs


def _gpt_pair(row: dict, path: Path, line: int) -> tuple[str | None, str | dict]:
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise PipelineError(f"{path}:{line}: expected {{messages: [...]}} (FireAct gpt format, or chat messages "
                            "with tool calls: docs/formats.md)")
    if any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        return None, row
    if messages[0].get("role") != "user":
        return None, ""  # a chat that starts with the assistant has lost its question
    return messages[0]["content"], "\n".join(m.get("content") or "" for m in messages[1:])


def _hotpotqa_questions(path: Path) -> set[str]:
    folders = [path.parent, path.parent.parent / "alpaca_format", path.parent.parent / "gpt_format"]
    found = [folder / name for folder in folders for name in HOTPOTQA_FILES if (folder / name).is_file()]
    if not found:
        raise PipelineError(
            f"{path}: a multitask file mixes HotpotQA with other tasks, and no FireAct hotpotqa.json/.jsonl "
            "was found beside it to tell them apart; put it there, or pass other_tasks=true to keep all tasks"
        )
    return {q.strip() for f in found for q, _ in _read_pairs(f) if q}


def parse_fireact_text(text: str) -> tuple[str, list[Step]]:
    """FireAct's `Thought:/Action:/Observation:` lines -> (text before the first label, steps).

    Unlabelled lines continue the segment above them (multi-line thoughts and snippets); the
    renderer joins them into one line. Raises Skip when the lines do not form steps."""
    preamble: list[str] = []
    segments: list[list] = []  # [label, text]
    for line in text.strip().split("\n"):
        m = _LABEL.match(line)
        if m:
            segments.append([m.group(1), m.group(2)])
        elif segments:
            segments[-1][1] += "\n" + line
        elif line.strip():
            preamble.append(line)
    steps: list[Step] = []
    expect = {"Thought", "Action"}
    for label, body in segments:
        if label not in expect:
            raise Skip("malformed")
        if label == "Thought":
            steps.append(Step(thought=body.strip()))
            expect = {"Action"}
        elif label == "Action":
            if not steps or steps[-1].action is not None:
                steps.append(Step())
            steps[-1].action = body.strip()
            expect = {"Observation"}
        else:
            steps[-1].observation = body.strip()
            expect = {"Thought", "Action"}
    if not steps or expect != {"Thought", "Action"}:
        raise Skip("malformed")  # empty, or the last step lacks its observation
    return "\n".join(preamble), steps


def fireact_episode(question: str, text: str, *, source: str, multimethod: bool = False) -> dict:
    """One FireAct trajectory -> our episode record (raises Skip with a reason)."""
    if REFLEXION_MARKER in text:
        raise Skip("reflexion")
    preamble, steps = parse_fireact_text(text)
    if preamble:  # e.g. multiple-choice options written before the first thought
        question = f"{question}\n{preamble}"
    for i, step in enumerate(steps):
        step.action = _capitalised_action(step.action, last=i == len(steps) - 1)
    answer = _ACTION.match(steps[-1].action).group(2).strip()
    reward = _FINISHED.match(steps[-1].observation or "")
    if reward is None:
        raise Skip("bad_finish_observation")
    correct = reward.group(1) in ("True", "1", "1.0")
    # our environment's own text for the finish observation (FireAct writes True/False)
    steps[-1].observation = f"Episode finished, reward = {int(correct)}"
    trajectory = Trajectory(question=question, format=_format(steps, reward.group(1), multimethod),
                            steps=steps, answer=answer)
    if trajectory.format == "cot":
        trajectory.reasoning, trajectory.steps = steps[0].thought, []
    return _episode_record(trajectory, correct, source)


def tool_calls_episode(row: dict, path: Path) -> dict:
    """One row of chat messages with tool calls -> our episode record (raises Skip with a reason)."""
    try:
        trajectory, finish_result = from_messages(row["messages"])
    except NotToolCalls as exc:
        raise Skip(exc.reason) from None
    if trajectory.answer is None:
        raise Skip("no_finish")
    reward = _FINISHED.match(finish_result or "")
    if reward is not None:
        correct = reward.group(1) in ("True", "1", "1.0")
    elif isinstance(row.get("em"), (int, float)) and not isinstance(row.get("em"), bool):
        correct = row["em"] == 1
    else:
        raise Skip("no_reward")
    if trajectory.steps:  # our environment's own text for the finish observation
        trajectory.steps[-1].observation = f"Episode finished, reward = {int(correct)}"
    episode = _episode_record(trajectory, correct, f"messages:{path.parent.name}/{path.name}")
    reward_source = "the finish call's tool result" if reward is not None else "the row's em"
    episode.update(teacher=str(row.get("teacher") or f"unknown ({path.name} names no teacher)"),
                   em_source=f"{reward_source}; correctness was not checked against a gold answer",
                   observation_source=f"the tool results in {path.name}" if trajectory.steps else None)
    return episode


def _capitalised_action(action: str, *, last: bool) -> str:
    m = _ACTION.match(action)
    if m is None:
        raise Skip("malformed_action")
    name = ACTION_NAMES.get(m.group(1).lower())
    if name is None:
        raise Skip("unknown_action")
    if (name == "Finish") != last:
        raise Skip("finish_not_last" if name == "Finish" else "no_finish")
    return f"{name}[{m.group(2).strip()}]"


def _format(steps: list[Step], reward_text: str, multimethod: bool) -> str:
    thoughts = [s.thought is not None for s in steps]
    if not any(thoughts):
        if len(steps) == 1:
            # answers with no thought and no tool call: no format teaches that (FireAct has no Act)
            raise Skip("finish_without_thought_or_search")
        return "act"
    if not all(thoughts):
        raise Skip("mixed_thoughts")
    # In multimethod files a single thought then finish[] is a CoT trajectory. FireAct's CoT runner
    # logs `reward = 1`, its ReAct runner `reward = True`: a one-step ReAct run stays ReAct.
    if multimethod and len(steps) == 1 and reward_text not in ("True", "False"):
        return "cot"
    return "react"


def _episode_record(trajectory: Trajectory, correct: bool, source: str) -> dict:
    steps = [vars(s).copy() for s in trajectory.steps]
    return {
        "id": question_id(trajectory.question),
        "question": trajectory.question,
        "gold_answer": None,
        "method": trajectory.format,  # the record's method: the one of the same name as its format
        "teacher": TEACHER,
        "prediction": trajectory.answer,
        "em": float(correct),
        "f1": float(correct),
        "finished": True,
        "end_reason": "finish",
        "n_steps": len(steps),
        "steps": steps,
        "trajectory": trajectory.to_dict(),
        "text": render(trajectory).text,
        "prompt_tokens": 0,  # not released
        "completion_tokens": 0,
        "seconds": 0.0,
        "source": source,
        "em_source": EM_SOURCE,
        "observation_source": OBSERVATION_SOURCE if steps else None,  # CoT has no observations
        "fireact_reward": correct,
    }


def find_fireact_files(path: str | Path) -> list[Path]:
    """A FireAct file, or every trajectory file in a folder (alpaca_format/, gpt_format/)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".json", ".jsonl") and p.parent.name != "trajs")
        if files:
            return files
        raise PipelineError(f"{path}: no FireAct .json/.jsonl trajectory files inside")
    raise PipelineError(f"{path}: not found; give a FireAct alpaca .json, gpt .jsonl, or a folder of them")


# ---------------------------------------------------------------- eval runs

_RUN_NAME = re.compile(r"^hotpotqa_dev_(\d+)_(\d+)_(.+?)_\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}$")
_LLAMA = re.compile(r"llama-2-(\d+)b", re.IGNORECASE)


def fireact_run_model(stem: str) -> tuple[str, str, float | None]:
    """(model label, size class, params_b) from a FireAct run file name.

    `..._llama_models_lora_llama-2-7b-d_1000_0.7_<date>` -> ("Llama-2-7B (FireAct LoRA)", "7b", 7.0);
    fine-tuned gpt-3.5 has no published size: size class "undisclosed", params_b None."""
    m = _RUN_NAME.match(stem)
    run = m.group(3) if m else stem
    llama = _LLAMA.search(run)
    if llama:
        kind = "LoRA" if "lora" in run.lower() else "fine-tuned"
        size = int(llama.group(1))
        return f"Llama-2-{size}B (FireAct {kind})", f"{size}b", float(size)
    gpt = re.search(r"(gpt-[\w.\-]+?-\d{4})", run)
    if gpt:
        return f"{gpt.group(1)} (FireAct fine-tuned)", "undisclosed", None
    raise PipelineError(f"{stem}: cannot tell the model from this FireAct run name; rename it like "
                        "hotpotqa_dev_0_500_llama_models_lora_llama-2-7b-..._<date>.json")


def read_fireact_eval_run(path: str | Path, *, question_set: str = "react-dev500") -> dict:
    """A FireAct eval run (dict keyed by dev index) -> one summary row (docs/formats.md).

    EM and F1 are recomputed from `pred` and `gt` with our HotpotQA metrics; `em_recorded` is
    FireAct's own field, and a disagreement between the two raises. `n` counts the records in the
    file (a run may have fewer than 500); `em_over_500` counts the missing ones as wrong."""
    path = Path(path)
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise PipelineError(f"{path}: cannot read FireAct eval run ({exc})") from None
    if not isinstance(run, dict) or not run:
        raise PipelineError(f"{path}: expected a non-empty JSON object keyed by dev index (FireAct trajs/)")
    model, size_class, params_b = fireact_run_model(path.stem)
    hotpotqa = get_task("hotpotqa")  # FireAct's runs answer HotpotQA's dev questions
    ems, f1s, finished, steps = [], [], 0, []
    for key, record in run.items():
        for name in ("em", "pred", "gt", "traj"):
            if name not in record:
                raise PipelineError(f"{path}: record {key} lacks '{name}'")
        scores = hotpotqa.scores(record["pred"], record["gt"])
        em = scores["em"]
        if em != float(bool(record["em"])):
            raise PipelineError(f"{path}: record {key}: recomputed EM {em} differs from FireAct's {record['em']} "
                                f"(pred {record['pred']!r}, gt {record['gt']!r})")
        ems.append(em)
        f1s.append(scores["f1"])
        text = record["traj"] if isinstance(record["traj"], str) else json.dumps(record["traj"])
        actions = re.findall(r"Action(?: \d+)?: (\w+)\[", text)
        steps.append(len(actions))
        finished += any(a.lower() == "finish" for a in actions)
    n = len(ems)
    return {
        "model": model, "size_class": size_class, "params_b": params_b, "mode": "finetune",
        "method": "react", "question_set": question_set, "n": n,
        "em": sum(ems) / n, "f1": sum(f1s) / n, "finish_rate": finished / n,
        "mean_steps": sum(steps) / n, "prompt_tokens": None, "completion_tokens": None,
        "seconds": None, "source": "fireact",
        "em_over_500": sum(ems) / 500 if n <= 500 else None,
        "file": path.name,
        "note": "FireAct's released eval run, Google-search tool; EM recomputed from pred/gt",
    }


def read_fireact_eval_runs(path: str | Path) -> list[dict]:
    """Summary rows for one run file or every *.json run in a folder."""
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise PipelineError(f"{path}: no FireAct eval runs (trajs/*.json) found")
    return [read_fireact_eval_run(f) for f in files]


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.hub.importers", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    traj = sub.add_parser("trajectories", help="FireAct fine-tuning files -> episode records (JSONL)")
    traj.add_argument("paths", nargs="+", type=Path)
    traj.add_argument("-o", "--out", type=Path, required=True)
    traj.add_argument("--other-tasks", action="store_true", help="keep non-HotpotQA questions of multitask files")
    runs = sub.add_parser("runs", help="FireAct eval runs (trajs/*.json) -> summary rows (JSON)")
    runs.add_argument("paths", nargs="+", type=Path)
    runs.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.what == "trajectories":
            lines = []
            for f in (f for p in args.paths for f in find_fireact_files(p)):
                episodes, report = read_fireact_trajectories(f, other_tasks=args.other_tasks)
                print(report.line())
                lines += [json.dumps(e, ensure_ascii=False) for e in episodes]
            atomic_write_text(args.out, "".join(line + "\n" for line in lines))
            print(f"wrote {len(lines)} episodes to {args.out}")
        else:
            rows = [row for p in args.paths for row in read_fireact_eval_runs(p)]
            for row in rows:
                over_500 = "" if row["em_over_500"] is None else f" (over 500: {row['em_over_500']:.4f})"
                print(f"{row['model']}: n={row['n']} EM {row['em']:.4f}{over_500} "
                      f"F1 {row['f1']:.4f} finish {row['finish_rate']:.3f}")
            atomic_write_json(args.out, rows)
            print(f"wrote {len(rows)} summary rows to {args.out}")
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


__all__ = [
    "ImportReport", "Skip", "fireact_episode", "tool_calls_episode", "find_fireact_files", "fireact_run_model",
    "parse_fireact_text", "question_id", "read_fireact_eval_run",
    "read_fireact_eval_runs", "read_fireact_trajectories",
]

if __name__ == "__main__":
    sys.exit(main())
