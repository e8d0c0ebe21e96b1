"""HotpotQA's official answer metrics: normalisation, exact match, token F1, and aggregates.

Mirrors `hotpot_evaluate_v1.py`. Its normalisation (lower-case, drop punctuation and the
articles a/an/the, collapse whitespace) is in pipeline/tasks/base.py: FEVER's wrapper uses it
too. F1 is 0 when either side normalises to yes/no/noanswer and they differ.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pipeline.tasks.base import normalize_answer

_SPECIAL = ("yes", "no", "noanswer")


def exact_match(prediction: str | None, gold: str) -> float:
    return float(normalize_answer(prediction or "") == normalize_answer(gold))


def f1_score(prediction: str | None, gold: str) -> float:
    pred, ref = normalize_answer(prediction or ""), normalize_answer(gold)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def aggregate(pairs: Iterable[tuple[str | None, str]]) -> dict[str, float]:
    """Mean EM and F1 (as fractions) over (prediction, gold) pairs, with the count."""
    ems, f1s = [], []
    for prediction, gold in pairs:
        ems.append(exact_match(prediction, gold))
        f1s.append(f1_score(prediction, gold))
    n = len(ems)
    return {"n": n, "em": sum(ems) / n if n else 0.0, "f1": sum(f1s) / n if n else 0.0}
