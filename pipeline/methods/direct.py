"""Standard and CoT prompting: one generation per question, no environment.

The prompt is prefix + the question line ("Question: ...\n"; FEVER's "Claim: ...\n") + "Answer:"
(Standard) or "Thought:" (CoT); the model is stopped at the next question line ("\nQuestion:",
where it would start inventing the next exemplar) and the answer is read from the `Answer:` line.
"""

from __future__ import annotations

from pipeline.core.trajectory import COT_PREFIX, QUESTION_LABEL, Trajectory, one_line, question_line
from pipeline.llm.base import Completion
from pipeline.methods.base import (
    EpisodeContext,
    MethodSettings,
    Outcome,
    Program,
    completion_failure,
    request,
)
from pipeline.methods.prompts import PromptPrefix
from pipeline.tasks import Task

STOP = ["\nQuestion:"]  # HotpotQA's; a task's own is `stop_at(label)`
CUES = {"standard": "Answer:", "cot": "Thought:"}


def stop_at(label: str = QUESTION_LABEL) -> list[str]:
    """Stop where the model would start the next exemplar's question line."""
    return [f"\n{label}:"]


def direct_prompt(prefix: PromptPrefix, question: str, label: str = QUESTION_LABEL) -> str:
    return prefix.text + question_line(question, label) + CUES[prefix.format]


def parse_direct(c: Completion, fmt: str, question: str, label: str = QUESTION_LABEL) -> Outcome:
    """Turn one Standard / CoT completion (the text after the cue) into an Outcome."""
    traj = Trajectory(question, fmt, question_label=label)
    failure = completion_failure(c)
    if failure:
        return Outcome(traj, None, failure)
    text = c.text
    if fmt == "cot":
        head, marker, tail = text.partition("\nAnswer:")
        if not marker:
            return Outcome(traj, None, "runaway" if c.finish_reason == "length" else "no_action")
        # The renderer writes "Thought: Let's think step by step. <reasoning>": keep the part after.
        reasoning = one_line(head)
        opener = COT_PREFIX.strip()
        if reasoning.startswith(opener):
            reasoning = reasoning[len(opener):].strip()
        traj.reasoning = reasoning
        text = tail
    answer, newline, _ = text.lstrip(" ").partition("\n")
    answer = answer.strip()
    if c.finish_reason == "length" and not newline:
        # The answer line itself ran into the token limit: it is not a finished answer.
        return Outcome(traj, None, "runaway")
    if not answer:
        return Outcome(traj, None, "no_action")
    traj.answer = answer
    return Outcome(traj, answer, "finish")


class Direct:
    """Standard (fmt="standard") or CoT (fmt="cot") for `task` (default HotpotQA)."""

    def __init__(self, prefix: PromptPrefix, settings: MethodSettings, task: Task | str | None = None):
        from pipeline.tasks import get_task

        if prefix.format not in CUES:
            raise ValueError(f"Direct needs a standard or cot prefix, got {prefix.format!r}")
        self.prefix, self.settings, self.name, self.task = prefix, settings, prefix.format, get_task(task)

    def run(self, ctx: EpisodeContext) -> Program:
        label = self.task.question_label
        prompt = direct_prompt(self.prefix, ctx.text, label)
        [[completion]] = yield [request(prompt, stop_at(label), self.settings)]
        return parse_direct(completion, self.name, ctx.text, label)
