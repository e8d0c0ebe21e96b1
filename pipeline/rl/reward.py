"""The reward of one rollout, from the task's metric (`Task.scores`, the same that scores eval).

    em, f1, finished = reward_functions(get_task("fever"))
    em(completions, answer=["SUPPORTS"], prediction=["supports"])   -> [1.0]

The task is the one place a prediction meets the gold answer: HotpotQA's official EM, with token F1
as partial credit; FEVER's accuracy (its `f1` is that accuracy too: a label has no partial credit).
TRL calls one reward function per term with the batch's dataset columns (`answer`) and the rollout's
fields (`prediction`, `end_reason`); the reward is their weighted sum (`reward.em`, `reward.f1`,
`reward.format`), and TRL logs each term's mean as rewards/<term>/mean (the function's name).
"""

from __future__ import annotations

from pipeline.tasks import Task

TERMS = ("em", "f1", "format")


def reward_functions(task: Task) -> list:
    """The terms in TERMS order, scored by `task` (their weights are GRPOConfig.reward_weights, same order)."""

    def em(completions, answer, prediction, **_) -> list[float]:
        return [task.scores(p, a)["em"] for p, a in zip(prediction, answer, strict=True)]

    def f1(completions, answer, prediction, **_) -> list[float]:
        return [task.scores(p, a)["f1"] for p, a in zip(prediction, answer, strict=True)]

    return [em, f1, format]


def format(completions, end_reason, **_) -> list[float]:  # noqa: A001 (the term's name in TRL's logs)
    """1 for an episode that ended with Finish[...], whatever the answer."""
    return [1.0 if reason == "finish" else 0.0 for reason in end_reason]
