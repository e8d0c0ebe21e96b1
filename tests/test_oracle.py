"""The oracle teacher (a stand-in, not the paper's teacher) over the REAL local index built from
the shared corpus and real HotpotQA questions: EM 1 through the environment in every format.

    .venv/bin/python -m pytest tests/test_oracle.py
"""

from __future__ import annotations

import pytest

from pipeline.agent.scheduler import run_episodes
from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import Trajectory, parse, render
from pipeline.tasks import get_task
from pipeline.tasks.hotpotqa.oracle import TEACHER, oracle_method
from pipeline.tasks.hotpotqa.questions import load_question_set
from pipeline.wiki.env import SENTENCES_SHOWN, WikiEnv


@pytest.fixture(scope="module")
def index(shared_data, tmp_path_factory):
    from pipeline.wiki.index import LocalIndex, build_index

    path = tmp_path_factory.mktemp("wiki") / "index.sqlite"
    build_index([shared_data / "wiki" / "corpus.jsonl"], path)
    return LocalIndex(path)


@pytest.fixture(scope="module")
def questions(index):
    """15 offline-eval questions plus bootstrap ones whose gold pages are all in the index, and
    at least one with a supporting sentence beyond the first 5 (it needs a Lookup)."""
    evals = load_question_set("offline-eval", limit=15)
    pool = [q for q in load_question_set("offline-bootstrap")[:300]
            if all(index.get_page(t) is not None for t in q.gold_titles)]
    deep = [q for q in pool if any(i is not None and i >= SENTENCES_SHOWN for _, i in q.supporting_facts)]
    return evals + pool[:5] + deep[:2]


@pytest.fixture(scope="module")
def records(index, questions):
    return {fmt: run_episodes(None, lambda: index, questions, oracle_method(fmt), teacher=TEACHER)
            for fmt in ("react", "act", "cot", "standard")}


def test_every_format_is_correct_through_the_environment(records, questions):
    for fmt, recs in records.items():
        assert [r["id"] for r in recs] == [q.id for q in questions]
        for r in recs:
            assert (r["teacher"], r["method"], r["end_reason"], r["finished"]) == ("oracle", fmt, "finish", True), r
            assert r["em"] == 1.0 and r["f1"] == 1.0
            traj = Trajectory.from_dict(r["trajectory"])
            assert r["text"] == render(traj).text
            assert parse(r["text"], fmt) == traj
            assert r["prompt_tokens"] == r["completion_tokens"] == 0


def test_react_and_act_really_use_the_environment(records, questions, index):
    by_id = {q.id: q for q in questions}
    lookups = 0
    for fmt in ("react", "act"):
        for r in records[fmt]:
            q = by_id[r["id"]]
            actions = [s["action"] for s in r["steps"]]
            assert actions[-1] == f"Finish[{q.answer}]"
            assert [a for a in actions if a.startswith("Search[")] == [f"Search[{t}]" for t in q.gold_titles]
            lookups += sum(a.startswith("Lookup[") for a in actions)
            # Replaying the actions in a fresh environment gives the same observations.
            env = WikiEnv(index, score=get_task("hotpotqa").scores)
            env.reset(q.question, q.answer)
            assert [env.step(a)[0] for a in actions] == [s["observation"] for s in r["steps"]]
            assert r["steps"][-1]["observation"] == "Episode finished, reward = 1"
            # Every supporting sentence with an index was shown by some observation.
            seen = " ".join(s["observation"] for s in r["steps"])
            for title, i in q.supporting_facts:
                if i is not None and i < len(index.get_page(title).sentences):
                    assert index.get_page(title).sentences[i].strip() in seen, (q.id, title, i)
            thoughts = [s["thought"] for s in r["steps"]]
            if fmt == "react":
                assert all(t and "None" not in t for t in thoughts)
                assert thoughts[-1].endswith(f"So the answer is {q.answer}.")
            else:
                assert thoughts == [None] * len(thoughts)
    assert lookups >= 2  # the deep questions needed a Lookup in both formats


def test_cot_reasons_from_the_supporting_sentences(records, questions, index):
    by_id = {q.id: q for q in questions}
    for r in records["cot"]:
        q = by_id[r["id"]]
        reasoning = r["trajectory"]["reasoning"]
        assert reasoning.endswith(f"So the answer is {q.answer}.")
        title, i = q.supporting_facts[0]
        if i is not None:
            first = index.get_page(title).sentences[i].split()[:10]
            assert " ".join(first) in reasoning
        assert r["text"].startswith(f"Question: {q.question.strip()}\nThought: Let's think step by step. ")


def test_a_missing_gold_page_is_not_answered(index):
    missing = next(q for q in load_question_set("offline-bootstrap")[:400]
                   if any(index.get_page(t) is None for t in q.gold_titles))
    [rec] = run_episodes(None, lambda: index, [missing], oracle_method("react"), teacher=TEACHER)
    assert rec["end_reason"].startswith("oracle_missing_page: ")
    assert rec["finished"] is False and rec["prediction"] is None and rec["em"] == 0.0


def test_oracle_rejects_composite_methods():
    with pytest.raises(PipelineError, match="oracle teacher writes"):
        oracle_method("cot_sc")
