"""HotpotQA answer metrics: normalisation, EM, F1 (yes/no/noanswer rule), aggregate, evaluate.load."""

import json
import random
import re
import string
from collections import Counter
from pathlib import Path

import pytest

from pipeline.tasks.hotpotqa.metric import aggregate, exact_match, f1_score, normalize_answer

METRIC_MODULE = Path(__file__).resolve().parents[1] / "pipeline" / "tasks" / "hotpotqa" / "evaluate_metric.py"


# The official hotpot_evaluate_v1.py functions, transcribed as the reference to compare against.
def official_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def official_f1(prediction, ground_truth):
    p, g = official_normalize(prediction), official_normalize(ground_truth)
    if p in ["yes", "no", "noanswer"] and p != g:
        return 0
    if g in ["yes", "no", "noanswer"] and p != g:
        return 0
    common = Counter(p.split()) & Counter(g.split())
    same = sum(common.values())
    if same == 0:
        return 0
    precision, recall = same / len(p.split()), same / len(g.split())
    return 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize("text, expected", [
    ("Hello, World!", "hello world"),                 # case and punctuation
    ("U.S.A.", "usa"),                                 # punctuation removed, not replaced by space
    ("rock-and-roll", "rockandroll"),
    ("The Beatles", "beatles"),                        # leading article
    ("a cat and an owl at the zoo", "cat and owl at zoo"),
    ("theater", "theater"),                            # articles only as whole words
    ("Anthem of the Seas", "anthem of seas"),
    ("an\tapple \n  a   day ", "apple day"),           # whitespace collapsed
    ("The", ""),
    ("", ""),
    ("Café — Zürich", "café — zürich"),               # only ASCII punctuation is removed (as official)
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected
    assert official_normalize(text) == expected


def test_exact_match():
    assert exact_match("the Eiffel Tower.", "Eiffel Tower") == 1.0
    assert exact_match("EIFFEL   tower", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match(None, "Eiffel Tower") == 0.0
    assert exact_match("", "") == 1.0
    assert exact_match("theater", "ater") == 0.0


def test_f1_partial_and_repeated_tokens():
    assert f1_score("Barack Obama", "Obama") == pytest.approx(2 * 0.5 * 1 / 1.5)
    # Counter intersection: the second "new" has no partner -> precision 2/3, recall 1
    assert f1_score("new new york", "new york") == pytest.approx(0.8)
    assert f1_score("Paris", "London") == 0.0
    assert f1_score(None, "London") == 0.0
    assert f1_score("the", "a") == 0.0  # both normalise to "": no tokens, F1 0 (EM would be 1)


@pytest.mark.parametrize("prediction, gold, expected", [
    ("yes", "no", 0.0),
    ("Yes.", "yes", 1.0),
    ("yes it is", "yes", 0.0),     # token F1 would be 0.5; the special rule makes it 0
    ("yes", "yes it is", 0.0),
    ("noanswer", "no answer", 0.0),
    ("no", "no way", 0.0),
    ("no way", "no way", 1.0),
])
def test_f1_yes_no_noanswer_rule(prediction, gold, expected):
    assert f1_score(prediction, gold) == expected
    assert official_f1(prediction, gold) == expected


def test_aggregate():
    result = aggregate([("Eiffel Tower", "the Eiffel Tower"), ("Barack Obama", "Obama"), (None, "x")])
    assert result["n"] == 3
    assert result["em"] == pytest.approx(1 / 3)
    assert result["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert aggregate([]) == {"n": 0, "em": 0.0, "f1": 0.0}


def test_matches_official_on_real_dev_answers(shared_data):
    dev = json.loads((shared_data / "hotpotqa" / "dev_simplified.json").read_text(encoding="utf-8"))
    golds = [row["answer"] for row in dev]
    assert golds[:2] == ["yes", "Chief of Protocol"]
    assert exact_match("chief of protocol.", golds[1]) == 1.0
    rng = random.Random(0)
    pairs = []
    for gold in rng.sample(golds, 1500):
        other = rng.choice(golds)
        pairs += [(gold, gold), (f"The {gold.upper()}!", gold), (other, gold),
                  (f"{gold} {other}", gold), (gold.split()[0] if gold.split() else "", gold)]
    for prediction, gold in pairs:
        assert normalize_answer(prediction) == official_normalize(prediction)
        assert exact_match(prediction, gold) == float(official_normalize(prediction) == official_normalize(gold))
        assert f1_score(prediction, gold) == pytest.approx(official_f1(prediction, gold))
    scores = aggregate(pairs)
    assert 0.2 < scores["em"] < 0.8 and scores["em"] < scores["f1"] < 1.0


def test_evaluate_load_computes_offline(monkeypatch, tmp_path):
    evaluate = pytest.importorskip("evaluate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = evaluate.load(str(METRIC_MODULE), cache_dir=str(tmp_path))
    predictions = ["the Eiffel Tower", "yes", "Barack Obama", ""]  # "" = no answer
    references = ["Eiffel Tower", "no", "Obama", "Paris"]
    result = metric.compute(predictions=predictions, references=references)
    expected = aggregate(zip(predictions, references, strict=True))
    assert result == {"exact_match": expected["em"], "f1": expected["f1"], "n": 4}
    assert result["exact_match"] == pytest.approx(0.25)
    # incremental use, as in an eval loop
    for p, r in zip(predictions, references, strict=True):
        metric.add(prediction=p, reference=r)
    assert metric.compute() == result
