"""RAG, the field's retrieval baseline: one retrieval with the question, then an answer.

The environment's Search is sent once with the question itself (in the bm25 search mode,
wiki.search=bm25: the top k pages by BM25, each with its title); the prompt is the Standard
prefix (instruction and Question/Answer exemplars) + `Context: <the retrieved pages>` + the
question line + "Answer:", and the answer is read from the first line, as Standard's. The record
keeps the retrieval as its one step (action `Search[question]`, its observation), so the search
stats count it; the trajectory format stays Standard's (no student is trained on RAG rows).
The title mode has no retriever (the question is no page title): `rag` is refused there at plan
time (pipeline.agent.answerers).
"""

from __future__ import annotations

from pipeline.core.trajectory import QUESTION_LABEL, Step, Trajectory, one_line
from pipeline.methods.base import (
    EpisodeContext,
    MethodSettings,
    Outcome,
    Program,
    backend_errors,
    request,
)
from pipeline.methods.direct import direct_prompt, parse_direct, stop_at
from pipeline.methods.prompts import PromptPrefix
from pipeline.tasks import Task

CONTEXT_LABEL = "Context"


def rag_prompt(prefix: PromptPrefix, question: str, context: str, label: str = QUESTION_LABEL) -> str:
    """The Standard prompt with the retrieved pages on a `Context:` line before the question line."""
    return direct_prompt(PromptPrefix(prefix.format, prefix.instruction, prefix.exemplars + f"{CONTEXT_LABEL}: {context}\n",
                                      prefix.source), question, label)


class Rag:
    """One retrieval with the question, then a Standard answer, for `task` (default HotpotQA)."""

    def __init__(self, prefix: PromptPrefix, settings: MethodSettings, task: Task | str | None = None):
        from pipeline.tasks import get_task

        if prefix.format != "standard":
            raise ValueError(f"RAG answers with the standard prefix, got {prefix.format!r}")
        self.prefix, self.settings, self.name, self.task = prefix, settings, "rag", get_task(task)

    def run(self, ctx: EpisodeContext) -> Program:
        label = self.task.question_label
        env = ctx.make_env()
        env.reset(ctx.text)
        action = f"Search[{ctx.text}]"
        try:
            context = one_line(env.step(action)[0])
        except backend_errors() as exc:
            return Outcome(Trajectory(ctx.text, "standard", question_label=label), None,
                           f"backend_error: {type(exc).__name__}: {exc}")
        [[completion]] = yield [request(rag_prompt(self.prefix, ctx.text, context, label), stop_at(label), self.settings)]
        outcome = parse_direct(completion, "standard", ctx.text, label)
        outcome.trajectory.steps.append(Step(None, action, context))
        return outcome
