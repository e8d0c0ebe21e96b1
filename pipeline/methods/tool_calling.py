"""Act and ReAct through native tool calls (`prompting.interface: tools`).

Per step i (at most `max_steps`), the conversation so far goes to an OpenAI-compatible chat
endpoint as messages, with the tools' JSON schemas (pipeline/core/messages.py writes both, from
the trajectory so far, exactly as `filter` writes messages.jsonl): the question as the user's
turn, then each earlier step as an assistant turn with its tool call and a `role: tool` turn
with its observation. The reply's one tool call is the step's action (its content the thought;
Act keeps no thought), the environment runs it, and the next step starts. The episode record and
the trajectory are those of the text interface (pipeline/methods/interactive.py), so filter,
train, eval and plot read them as they are.

A reply that is not one valid call ends the episode with its reason, never a crash:
`no_tool_call` (text alone), `unknown_tool` (a name other than search, lookup, finish),
`bad_arguments` (arguments that are not JSON, or lack the tool's one string),
`several_tool_calls` (a step acts once). The text the model wrote is kept as the last step's
thought. A model error ends it as in the text interface (`llm_error: ...`, `context_exceeded`).
No exemplars and no instruction are sent: the chat template's own system turn lists the tools.
"""

from __future__ import annotations

from pipeline.core.messages import (
    NotToolCalls,
    reply_step,
    to_messages,
    tool_schemas,
    wire_messages,
)
from pipeline.core.trajectory import Step, Trajectory, one_line
from pipeline.llm.base import GenerationRequest
from pipeline.methods.base import (
    EpisodeContext,
    MethodSettings,
    Outcome,
    Program,
    completion_failure,
    take_step,
)
from pipeline.tasks import Task


class ToolCalling:
    """ReAct (`fmt == "react"`) or Act through tool calls, for `task` (default HotpotQA)."""

    def __init__(self, fmt: str, settings: MethodSettings, task: Task | str | None = None, search: str = "title"):
        from pipeline.tasks import get_task

        if fmt not in ("react", "act"):
            raise ValueError(f"tool calls drive react or act, not {fmt!r}")
        self.name, self.settings, self.task = fmt, settings, get_task(task)
        self.tools = tool_schemas(self.task.answer_space, search)  # the search tool as wiki.search has it

    def run(self, ctx: EpisodeContext) -> Program:
        traj = Trajectory(ctx.text, self.name, question_label=self.task.question_label)
        env = ctx.make_env()
        env.reset(ctx.text, ctx.question.answer)
        for _ in range(self.settings.max_steps):
            messages = wire_messages(to_messages(traj, answer_space=self.task.answer_space))
            [[c]] = yield [GenerationRequest(prompt="", messages=messages, tools=self.tools,
                                             max_new_tokens=self.settings.max_new_tokens,
                                             temperature=self.settings.temperature)]
            failure = completion_failure(c)
            if failure:
                return Outcome(traj, None, failure)
            try:
                step = reply_step(c.text, c.tool_calls)
            except NotToolCalls as refused:
                traj.steps.append(Step(one_line(c.text) or None if self.name == "react" else None, ""))
                return Outcome(traj, None, refused.reason, {"detail": str(refused)})
            if self.name == "act":
                step.thought = None
            ended = take_step(env, traj, step)
            if ended is not None:
                return ended
        return Outcome(traj, None, "step_limit")
