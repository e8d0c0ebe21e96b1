"""The reward of one rollout, from the task's metric.

    score("Paris", "paris")  -> {"em": 1.0, "f1": 1.0}

`score` is the one place a prediction meets the gold answer (HotpotQA's official EM and F1 today,
pipeline.tasks.hotpotqa.metric; the task seam will hand its own metric here). TRL calls one reward function per
term with the batch's dataset columns (`answer`) and the rollout's fields (`prediction`,
`end_reason`); the reward is their weighted sum (`reward.em`, `reward.f1`, `reward.format`), and
TRL logs each term's mean as rewards/<term>/mean.
"""

from __future__ import annotations

from pipeline.tasks.hotpotqa.metric import exact_match, f1_score

TERMS = ("em", "f1", "format")


def score(prediction: str | None, gold: str) -> dict[str, float]:
    """EM and F1 of an answer (no answer scores 0)."""
    if prediction is None:
        return {"em": 0.0, "f1": 0.0}
    return {"em": float(exact_match(prediction, gold)), "f1": float(f1_score(prediction, gold))}


def em(completions, answer, prediction, **_) -> list[float]:
    return [score(p, a)["em"] for p, a in zip(prediction, answer, strict=True)]


def f1(completions, answer, prediction, **_) -> list[float]:
    return [score(p, a)["f1"] for p, a in zip(prediction, answer, strict=True)]


def format(completions, end_reason, **_) -> list[float]:  # noqa: A001 (the term's name in TRL's logs)
    """1 for an episode that ended with Finish[...], whatever the answer."""
    return [1.0 if reason == "finish" else 0.0 for reason in end_reason]


def reward_functions() -> list:
    """The terms in TERMS order (their weights are GRPOConfig.reward_weights, same order)."""
    return [em, f1, format]
