"""Act and ReAct: the original ReAct agent loop, one step per model call.

Per step i (at most `max_steps`, 7 in the paper; 5 inside FEVER's hybrids):
  ReAct: prompt ends with "Thought {i}:", stop at "\nObservation {i}:"; the output is split at
         "\nAction {i}: " into thought and action. Without an action the model is asked again for
         "Action {i}:" alone (stop "\n"), with the first line of its output as the thought.
  Act:   prompt ends with "Action {i}:", stop at "\nObservation {i}:".
The action's first letter is lower-cased before it reaches the environment (as in the original);
the observation is appended and the next step starts. No answer after the last step: step_limit.

Where the original loop would crash or loop on bad text, the episode ends with a reason:
no action even when asked again (no_action), text that runs into the token limit without an
action or cut inside the action line (runaway), a context-window error (context_exceeded), any other model error
(llm_error: ...), and a failing page source (backend_error: ...). Several actions in one output:
the first line after "Action {i}: " is taken. Unbalanced brackets reach the environment, which
answers "Invalid action: ..." as the original does.

Every prompt is prefix + render(trajectory so far).text + the cue, so the text the model reads
is exactly the text the renderer writes into training data.

`loop: original` (the paper's mode) is the notebook's webthink step exactly: the output is split
at "\nAction {i}: " and must give two pieces; otherwise (no action, several, or text cut by the
token limit without one) the first line is the thought and "Action {i}:" is asked again with
stop "\n", whatever the first answer's finish reason. Text cut by the limit is used as it is:
there is no `runaway` ending (the environment answers a cut action as invalid). Only an empty
re-asked action ends the episode (`no_action`: the original would crash on `action[0]`). Act
has no original loop in the released code and runs the same in both modes.
"""

from __future__ import annotations

from pipeline.core.trajectory import Step, Trajectory, one_line, render
from pipeline.methods.base import (
    EpisodeContext,
    MethodSettings,
    Outcome,
    Program,
    completion_failure,
    request,
    take_step,
)
from pipeline.methods.prompts import PromptPrefix
from pipeline.tasks import Task


def split_thought_action(text: str, i: int) -> tuple[str, str | None]:
    """(thought, action) from a ReAct step's output; action None when none was produced."""
    head, marker, tail = text.strip().partition(f"\nAction {i}: ")
    if not marker:
        return one_line(head.split("\n")[0]), None
    action = tail.strip().split("\n")[0].strip()
    return one_line(head), (action or None)


def first_line(text: str) -> str:
    return text.strip().split("\n")[0].strip()


class Interactive:
    """ReAct (prefix.format == "react") or Act ("act") for `task` (default HotpotQA)."""

    def __init__(self, prefix: PromptPrefix, settings: MethodSettings, task: Task | str | None = None):
        from pipeline.tasks import get_task

        if prefix.format not in ("react", "act"):
            raise ValueError(f"Interactive needs a react or act prefix, got {prefix.format!r}")
        self.prefix, self.settings, self.name, self.task = prefix, settings, prefix.format, get_task(task)

    def run(self, ctx: EpisodeContext) -> Program:
        traj = Trajectory(ctx.text, self.name, question_label=self.task.question_label)
        env = ctx.make_env()
        env.reset(ctx.text, ctx.question.answer)
        for i in range(1, self.settings.max_steps + 1):
            head = self.prefix.text + render(traj).text
            if self.name == "react" and self.settings.loop == "original":
                step, reason = yield from self._original_react_step(head, i)
            elif self.name == "react":
                step, reason = yield from self._react_step(head, i)
            else:
                step, reason = yield from self._act_step(head, i)
            if reason:
                if step is not None:
                    traj.steps.append(step)
                return Outcome(traj, None, reason)
            ended = take_step(env, traj, step)
            if ended is not None:
                return ended
        return Outcome(traj, None, "step_limit")

    def _react_step(self, head: str, i: int):
        stop = [f"\nObservation {i}:"]
        [[c]] = yield [request(head + f"Thought {i}:", stop, self.settings)]
        failure = completion_failure(c)
        if failure:
            return None, failure
        thought, action = split_thought_action(c.text, i)
        if action is not None:
            if c.finish_reason == "length" and c.text.rstrip().endswith(action):
                return Step(thought, action), "runaway"  # the action line was cut by the limit
            return Step(thought, action), None
        if c.finish_reason == "length":
            return Step(thought, ""), "runaway"
        # The original loop: keep the thought's first line, ask for the action alone.
        [[c]] = yield [request(head + f"Thought {i}: {thought}\nAction {i}:", ["\n"], self.settings)]
        failure = completion_failure(c)
        if failure:
            return Step(thought, ""), failure
        action = c.text.strip()
        if c.finish_reason == "length":
            return Step(thought, one_line(action)), "runaway"
        if not action:
            return Step(thought, ""), "no_action"
        return Step(thought, action), None

    def _original_react_step(self, head: str, i: int):
        """hotpotqa.ipynb's webthink step (see the module docstring)."""
        [[c]] = yield [request(head + f"Thought {i}:", [f"\nObservation {i}:"], self.settings)]
        failure = completion_failure(c)
        if failure:
            return None, failure
        pieces = c.text.strip().split(f"\nAction {i}: ")
        if len(pieces) == 2:
            return Step(one_line(pieces[0]), one_line(pieces[1])), None
        thought = one_line(c.text.strip().split("\n")[0])
        [[c]] = yield [request(head + f"Thought {i}: {thought}\nAction {i}:", ["\n"], self.settings)]
        failure = completion_failure(c)
        if failure:
            return Step(thought, ""), failure
        action = one_line(c.text.strip())
        return Step(thought, action), (None if action else "no_action")

    def _act_step(self, head: str, i: int):
        [[c]] = yield [request(head + f"Action {i}:", [f"\nObservation {i}:"], self.settings)]
        failure = completion_failure(c)
        if failure:
            return None, failure
        action = first_line(c.text)
        if not action:
            return Step(None, ""), "runaway" if c.finish_reason == "length" else "no_action"
        if c.finish_reason == "length" and "\n" not in c.text.strip():
            return Step(None, one_line(action)), "runaway"
        return Step(None, action), None
