"""Methods built from others: CoT-SC (n CoT samples + a majority vote) and the paper's hybrids.

  CoT-SC           21 CoT samples at T=0.7 in ONE request (n=21); answers are compared after
                   the task's normalisation (HotpotQA's official one, which FEVER's original
                   wrapper uses too); the majority wins (ties: the answer seen first); the
                   outcome is the first sample that gave it.
  ReAct -> CoT-SC  run ReAct; if it gives no answer (step limit or any other ending without one,
                   or an empty `Finish[]`), run CoT-SC.
  CoT-SC -> ReAct  run CoT-SC; if the majority answer has fewer than n/2 votes, run ReAct.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from pipeline.methods.base import (
    EpisodeContext,
    Method,
    MethodSettings,
    Outcome,
    Program,
    episode_seed,
    request,
)
from pipeline.methods.direct import direct_prompt, parse_direct, stop_at
from pipeline.methods.interactive import Interactive
from pipeline.methods.prompts import PromptPrefix
from pipeline.tasks import Task


def majority(outcomes: list[Outcome], normalize: Callable[[str], str] | None = None) -> tuple[Outcome, int]:
    """The first outcome carrying the most frequent answer once normalised (by `normalize`, the
    task's: HotpotQA's by default), and its vote count.
    With no answer at all: the first outcome (its end reason says why) and 0 votes."""
    if normalize is None:
        from pipeline.tasks import get_task

        normalize = get_task().normalize
    keys = [normalize(o.prediction) if o.prediction is not None else "" for o in outcomes]
    votes = Counter(k for k in keys if k)
    if not votes:
        return outcomes[0], 0
    winner, count = votes.most_common(1)[0]  # ties: insertion order, i.e. the answer seen first
    return outcomes[keys.index(winner)], count


class SelfConsistency:
    name = "cot_sc"

    def __init__(self, prefix: PromptPrefix, settings: MethodSettings, task: Task | str | None = None):
        from pipeline.tasks import get_task

        if prefix.format != "cot":
            raise ValueError(f"CoT-SC needs a cot prefix, got {prefix.format!r}")
        self.prefix, self.settings, self.task = prefix, settings, get_task(task)

    def run(self, ctx: EpisodeContext) -> Program:
        s, label = self.settings, self.task.question_label
        req = request(direct_prompt(self.prefix, ctx.text, label), stop_at(label), s, n=s.cot_sc_samples,
                      temperature=s.cot_sc_temperature, seed=episode_seed(ctx.question.id, s.seed))
        [samples] = yield [req]
        outcome, votes = majority([parse_direct(c, "cot", ctx.text, label) for c in samples], self.task.normalize)
        return Outcome(outcome.trajectory, outcome.prediction, outcome.end_reason,
                       {"votes": votes, "samples": len(samples)})


class Fallback:
    """Run `primary`; when `needs_fallback(outcome)`, run `secondary` and keep its outcome."""

    def __init__(self, name: str, primary: Method, secondary: Method,
                 needs_fallback: Callable[[Outcome], bool]):
        self.name, self.primary, self.secondary, self.needs_fallback = name, primary, secondary, needs_fallback
        self.settings, self.task = primary.settings, primary.task

    def run(self, ctx: EpisodeContext) -> Program:
        first = yield from self.primary.run(ctx)
        if not self.needs_fallback(first):
            return first
        second = yield from self.secondary.run(ctx)
        second.details = {**second.details, "fallback_from": self.primary.name,
                          "primary_end_reason": first.end_reason}
        return second


def no_answer(outcome: Outcome) -> bool:
    """The paper's rule "when ReAct fails to return an answer": no Finish, or a blank one. An
    empty `Finish[]` is what the original loop itself sends after the step limit, so it counts
    as no answer here (our choice; the original code has no hybrid to copy)."""
    return outcome.prediction is None or not outcome.prediction.strip()


def weak_majority(outcome: Outcome) -> bool:
    """Fewer than n/2 of the n samples agree with the majority answer."""
    return outcome.details["votes"] < outcome.details["samples"] / 2


def hybrid_react(prefix: PromptPrefix, settings: MethodSettings, task: Task) -> Interactive:
    """ReAct inside a hybrid: the task's step limit (the paper's FEVER: 5), if it sets one."""
    return Interactive(prefix, replace(settings, max_steps=task.hybrid_react_steps or settings.max_steps), task)


def react_then_cot_sc(react: PromptPrefix, cot: PromptPrefix, settings: MethodSettings, task: Task) -> Fallback:
    """ReAct -> CoT-SC (the module docstring)."""
    return Fallback("react_to_cot_sc", hybrid_react(react, settings, task), SelfConsistency(cot, settings, task),
                    no_answer)


def cot_sc_then_react(cot: PromptPrefix, react: PromptPrefix, settings: MethodSettings, task: Task) -> Fallback:
    """CoT-SC -> ReAct (the module docstring)."""
    return Fallback("cot_sc_to_react", SelfConsistency(cot, settings, task), hybrid_react(react, settings, task),
                    weak_majority)
