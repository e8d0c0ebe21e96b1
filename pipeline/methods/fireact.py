"""FireAct's format: how FireAct's released agents (Chen et al. 2023) were trained to decode.

Read from FireAct's released code (github.com/anchen1011/FireAct, `generation.py`,
`models/llama.py`, `finetune/llama_lora/finetune.py`) and data (`data/finetune/alpaca_format`):

- the prompt is the Alpaca instruction wrapper around the question, zero-shot
  (`prepare_prompt` at inference, `generate_prompt` with `input == ""` at training):
      Below is an instruction that describes a task. Write a response that appropriately completes the request.

      ### Instruction:
      <question>

      ### Response:
- then unnumbered lines, one step per iteration: `Thought: ...`, `Action: search[x]` (lower-case
  action names), `Observation: ...`; a finish ends with `Observation: Episode finished, reward = True`
  (or False: FireAct prints the exact-match boolean);
- each iteration asks for `<prompt so far>Thought:` with the stop string `\\nObservation:`; the
  output is split at `\\nAction: `; with no action at all, the model is asked for the action alone
  after `Thought: <thought>\\nAction:`; at most 11 iterations (`while iteration < 11`). The
  token budget per call is `method.max_new_tokens` (FireAct's Llama interface allowed 1,000).

`render(traj)` writes a ReAct trajectory in this text (our capitalised actions and 0/1 rewards are
converted), so the same renderer builds the prompt at every step and FireAct-style training text;
tests check it against FireAct's released fine-tuning data and eval runs character for character.

Differences from FireAct's loop, stated: observations come from this project's environment
(Wikipedia), not FireAct's Google-search tool (which has no Lookup); FireAct first re-asks a
no-action output up to 5 times without a stop string before repairing it, which we skip (under
greedy decoding the repair is what decides); an action FireAct could not split at `[` leaves its
prompt unchanged, so a greedy model repeats it until the limit: we end that episode at once
(`no_action`), with the same outcome (no answer).
"""

from __future__ import annotations

import re
from dataclasses import replace

from pipeline.core.trajectory import Rendered, Step, Trajectory, one_line
from pipeline.methods.base import (
    EpisodeContext,
    MethodSettings,
    Outcome,
    Program,
    completion_failure,
    request,
    step_env,
)

FORMAT = "fireact"
HEADER = ("Below is an instruction that describes a task. "
          "Write a response that appropriately completes the request.\n\n")
STOP = ["\nObservation:"]
MAX_ITERATIONS = 11  # generation.py: `while iteration < 11: iteration += 1`
SOURCE = "fireact: Alpaca instruction wrapper, zero-shot (github.com/anchen1011/FireAct)"

_REWARD = re.compile(r"^Episode finished, reward = (1|0|1\.0|0\.0|True|False)$")
_ACTION_NAME = re.compile(r"^\s*([A-Za-z]+)\s*\[")
_STEP = re.compile(r"Thought: (.*?)\nAction: (.*?)\nObservation: (.*?)\n(?=Thought: |\Z)", re.DOTALL)


def alpaca_prompt(question: str) -> str:
    """FireAct's `prepare_prompt(question.rstrip())` (= `generate_prompt` with an empty input)."""
    return f"{HEADER}### Instruction:\n{question.rstrip()}\n\n### Response:\n"


def fireact_action(action: str) -> str:
    """`Search[x]` -> `search[x]`: FireAct's data writes action names in lower case."""
    m = _ACTION_NAME.match(action or "")
    return action if m is None else action[: m.start(1)] + m.group(1).lower() + action[m.end(1):]


def fireact_observation(observation: str) -> str:
    """Our environment's `reward = 1` is FireAct's `reward = True` (the exact-match boolean)."""
    m = _REWARD.match(observation.strip())
    if m is None:
        return observation
    return f"Episode finished, reward = {m.group(1) in ('1', '1.0', 'True')}"


def render(traj: Trajectory) -> Rendered:
    """A ReAct trajectory in FireAct's text: prompt = the Alpaca wrapper, completion = the steps.
    Fields are written as they are (FireAct's loop appends them verbatim); observation spans as in
    pipeline.core.trajectory.render."""
    if traj.format != "react":
        raise ValueError(f"FireAct's format holds ReAct trajectories, not {traj.format!r}")
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    offset = 0
    for step in traj.steps:
        head = f"Thought: {step.thought or ''}\nAction: {fireact_action(step.action or '')}\n"
        parts.append(head)
        offset += len(head)
        if step.observation is not None:
            obs = fireact_observation(step.observation)
            parts.append(f"Observation: {obs}\n")
            spans.append((offset + len("Observation: "), offset + len("Observation: ") + len(obs)))
            offset += len("Observation: ") + len(obs) + 1
    return Rendered(alpaca_prompt(traj.question), "".join(parts), spans)


def parse(text: str) -> Trajectory:
    """FireAct's full text (Alpaca wrapper + steps, as in its training data and eval runs) ->
    a ReAct Trajectory holding the fields verbatim (render(parse(t)).text == t for its files).
    A thought or an action may span lines, as FireAct's loop keeps what the model wrote up to
    the next `\nAction: ` / `\nObservation:`."""
    head, marker, body = text.partition("\n\n### Response:\n")
    prefix = f"{HEADER}### Instruction:\n"
    if not marker or not head.startswith(prefix):
        raise ValueError("not FireAct's Alpaca text: expected the instruction header and '### Response:'")
    traj = Trajectory(question=head[len(prefix):], format="react")
    end = 0
    for m in _STEP.finditer(body):
        if m.start() != end:
            break
        thought, action, observation = m.groups()
        traj.steps.append(Step(thought, action, observation))
        end = m.end()
    if end != len(body):
        raise ValueError(f"not FireAct's step lines at offset {end}: {body[end:end + 60]!r}")
    if traj.steps and traj.steps[-1].action.lower().startswith("finish["):
        traj.answer = traj.steps[-1].action[len("finish["):].removesuffix("]")
    return traj


def split_output(text: str) -> tuple[str, str | None]:
    """(thought, action) from one iteration's output, as FireAct's loop splits it."""
    if text.startswith("Thought: "):  # models/llama.py strips a repeated cue
        text = text[len("Thought: "):]
    text = text.strip()
    if "\nAction: " in text:
        thought, action = text.split("\nAction: ")[:2]
        return thought.strip(), action
    if text.startswith("Action: "):
        return "", text[len("Action: "):]
    return text.split("\n")[0], None


def env_action(action: str) -> str | None:
    """FireAct's `action.split('[')[:2]` with the closing bracket cut; None when there is no `[`.
    Any action type containing `finish` finishes, as in FireAct's loop."""
    if "[" not in action:
        return None
    kind, argument = action.split("[")[:2]
    argument = argument[:-1]
    kind = "finish" if "finish" in kind.lower() else kind.strip().lower()
    return f"{kind}[{argument}]"


class FireActReAct:
    """FireAct's agent loop as an episode program (pipeline.methods.base), against our environment."""

    name = "react"

    def __init__(self, settings: MethodSettings):
        from pipeline.tasks import get_task

        # Its own iteration limit, whatever the settings say (WikiEnv gets the same limit).
        self.settings = replace(settings, max_steps=MAX_ITERATIONS)
        self.task = get_task("hotpotqa")  # FireAct's agents were trained on HotpotQA questions

    def run(self, ctx: EpisodeContext) -> Program:
        # The question as given (FireAct only strips its end), not our one-line form.
        traj = Trajectory(ctx.question.question.rstrip(), "react")
        env = ctx.make_env()
        env.reset(ctx.text, ctx.question.answer)
        for _ in range(MAX_ITERATIONS):
            head = render(traj).text
            [[c]] = yield [request(head + "Thought:", STOP, self.settings)]
            failure = completion_failure(c)
            if failure:
                return Outcome(traj, None, failure)
            thought, action = split_output(c.text)
            if action is None:
                if c.finish_reason == "length":
                    traj.steps.append(Step(one_line(thought), ""))
                    return Outcome(traj, None, "runaway")
                [[c]] = yield [request(head + f"Thought: {thought}\nAction:", STOP, self.settings)]
                failure = completion_failure(c)
                if failure:
                    return Outcome(traj, None, failure)
                action = c.text.strip()
            command = env_action(action)
            step = Step(thought, action)
            traj.steps.append(step)
            if command is None:
                return Outcome(traj, None, "no_action")
            observation, ended = step_env(env, traj, command)
            if observation is None:
                return ended
            step.observation = fireact_observation(one_line(observation.replace("\\n", "")))
            if ended is not None:
                return ended
        return Outcome(traj, None, "step_limit")
