"""FEVER's `oracle` teacher: a STAND-IN that replays ReAct's 500 released FEVER trajectories
(text-davinci-002, prompted with the paper's 3 exemplars) through our environment. It is NOT a
teacher of ours and not the paper's PaLM-540B: every decision (thought, action, answer) is the
released model's, every observation is our environment's. FEVER's `paper_dev.jsonl` carries no
evidence sentences (only page and sentence ids), so an oracle that reads gold facts, as
HotpotQA's does, cannot be built from the offline data; the released trajectories are the
decisions that exist. Their answers are right on 270 of the 500 claims, so `filter` keeps
only those, as it would a real teacher's.

  react   the released thoughts and actions, step by step, each observation from our WikiEnv
  act     the same actions without the thoughts
  cot     the released episode's last thought (the one that reasons to its answer), then its answer
  standard  its answer
A claim with no released trajectory ends `oracle_missing_trajectory: <line>`; a released episode
that never finished ends `step_limit`, as it ended there.

    run_episodes(None, lambda: index, claims, replay_method("react"), sink, teacher="oracle")
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.storage import utf8_lines
from pipeline.core.trajectory import FORMATS, Step, Trajectory, one_line
from pipeline.methods.base import EpisodeContext, MethodSettings, Outcome, Program, step_env
from pipeline.tasks.base import DEFAULT_ORACLE_STYLE
from pipeline.wiki.actions import env_action

_LINE = re.compile(r"^(Thought|Action|Observation) (\d+): ?(.*)$")
_FINISH = re.compile(r"^\s*[Ff]inish\[(.*)\]\s*$")
_SEARCH = re.compile(r"^\s*[Ss]earch\[(.+)\]\s*$")


@dataclass
class Released:
    """One released trajectory: its (thought, action) steps and the answer it finished with."""

    steps: list[tuple[str, str]] = field(default_factory=list)
    answer: str | None = None
    claim: str | None = None  # the claim it answered (the file's `claim`): a line index alone names no claim


def parse_released(text: str) -> Released:
    """`Thought i:` / `Action i:` lines of a released `traj` (observations are ours to make)."""
    thoughts: dict[int, str] = {}
    released = Released()
    for line in text.split("\n"):
        m = _LINE.match(line)
        if m is None:
            continue
        kind, i, body = m.group(1), int(m.group(2)), m.group(3).strip()
        if kind == "Thought":
            thoughts[i] = body
        elif kind == "Action":
            released.steps.append((thoughts.get(i, ""), body))
            finish = _FINISH.match(body)
            if finish:
                released.answer = finish.group(1).strip() or None
                break
    return released


def searched_titles(released: Released) -> list[str]:
    """The titles a released trajectory searched for, in order."""
    return [m.group(1).strip() for _, action in released.steps if (m := _SEARCH.match(action))]


@functools.lru_cache(maxsize=2)
def released_trajectories(path: Path) -> dict[int, Released]:
    """The released trajectories of `path` by claim line (`question_idx`)."""
    out = {}
    for lineno, line in utf8_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out[int(row["question_idx"])] = released = parse_released(row["traj"])
            released.claim = row.get("claim")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise PipelineError(f"{path}:{lineno}: not a released FEVER trajectory ({exc})") from None
    return out


def replay_method(fmt: str, settings: MethodSettings | None = None, style: str = DEFAULT_ORACLE_STYLE) -> ReplayTeacher:
    if fmt not in FORMATS:
        raise PipelineError(f"the oracle teacher writes {', '.join(FORMATS)} trajectories, not '{fmt}'")
    if style != DEFAULT_ORACLE_STYLE:
        raise PipelineError(f"oracle={style} is a search style of HotpotQA's oracle; FEVER's replays released "
                            f"trajectories (set oracle: {DEFAULT_ORACLE_STYLE})")
    return ReplayTeacher(fmt, settings or MethodSettings())


class ReplayTeacher:
    """An episode program (pipeline.methods.base) that never asks a model."""

    def __init__(self, fmt: str, settings: MethodSettings):
        from pipeline.core.paths import resolve_source
        from pipeline.tasks import get_task

        self.name, self.settings, self.task = fmt, settings, get_task("fever")
        self.released = released_trajectories(resolve_source("react-fever-trajectories"))

    def run(self, ctx: EpisodeContext) -> Program:
        return self.write(ctx)
        yield  # unreachable: makes run() a generator, like every other method's program

    def write(self, ctx: EpisodeContext) -> Outcome:
        traj = Trajectory(ctx.text, self.name, question_label=self.task.question_label)
        released = self.released.get(ctx.question.index)
        if released is None:
            return Outcome(traj, None, f"oracle_missing_trajectory: {ctx.question.index}")
        if self.name in ("standard", "cot"):
            if released.answer is None:
                return Outcome(traj, None, "step_limit")
            traj.answer = released.answer
            if self.name == "cot":
                traj.reasoning = one_line(released.steps[-1][0])
            return Outcome(traj, released.answer, "finish")
        return self.replay(ctx, traj, released)

    def replay(self, ctx: EpisodeContext, traj: Trajectory, released: Released) -> Outcome:
        env = ctx.make_env()
        env.reset(ctx.text, ctx.question.answer)
        for thought, action in released.steps[:self.settings.max_steps]:
            observation, ended = step_env(env, traj, env_action(action))
            if observation is None:
                return ended
            traj.steps.append(Step(one_line(thought) if self.name == "react" else None, action, one_line(observation)))
            if ended is not None:
                return ended
        return Outcome(traj, None, "step_limit")
