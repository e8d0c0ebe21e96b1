"""`generate` target mode: draw questions in a seeded order until each method has N correct
episodes or the pool is exhausted; resumable; reports the questions each method needed.

    .venv/bin/python -m pytest tests/test_generate_target.py -q
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from episode_testdata import CORPUS, read_records, run_pipeline, write_questions

from pipeline.core.storage import read_manifest
from pipeline.stages.generate import draw_order, target_progress
from pipeline.tasks import get_task

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@pytest.fixture(scope="module")
def pool():
    """8 offline-eval questions; the oracle cannot answer two (gold page missing from the corpus)."""
    from pipeline.tasks.hotpotqa.questions import load_question_set

    qs = load_question_set("offline-eval", limit=8)
    for i in (1, 4):
        qs[i] = replace(qs[i], id=f"no-page-{i}", supporting_facts=[["No Such Page At All 4711", 0]])
    return qs


def args(index, question_file, out, *extra):
    return ("generate", "oracle=exact", f"questions={question_file}", f"wiki.index={index}",
            f"out_dir={out}", "methods=[react,standard]", "max_in_flight=2", "order_seed=7", *extra)


def test_draws_in_seeded_order_until_the_target_and_resumes(tmp_path, index, pool):
    question_file = write_questions(tmp_path / "q.jsonl", pool)
    out = tmp_path / "gen"
    order = [q.id for q in draw_order(pool, 7)]
    proc = run_pipeline(*args(index, question_file, out, "target_correct=3"))
    assert proc.returncode == 0, proc.stderr
    first = read_records(out / "react.jsonl")
    drawn = {r["id"] for r in first}
    assert drawn == set(order[:len(drawn)])  # a prefix of the seeded order
    assert sum(r["em"] == 1.0 and r["finished"] for r in first) >= 3
    stats = read_manifest(out / "manifest.json")["stats"]["react"]["target"]
    correct_positions = [i for i, qid in enumerate(order, 1) if not qid.startswith("no-page")]
    assert stats["reached"] and stats["questions_needed"] == correct_positions[2]
    assert "target 3 correct" in proc.stdout

    # a larger target continues from the same records (resume), up to the pool's end
    proc = run_pipeline(*args(index, question_file, out, "target_correct=50"))
    assert proc.returncode == 0, proc.stderr
    again = read_records(out / "react.jsonl")
    assert [r["id"] for r in again[:len(first)]] == [r["id"] for r in first]
    assert len(again) == len({r["id"] for r in again}) == len(pool)
    stats = read_manifest(out / "manifest.json")["stats"]["react"]["target"]
    assert not stats["reached"] and stats["correct"] == 6 and stats["drawn"] == stats["pool"] == 8
    assert "NOT reached: the pool of 8 is exhausted" in proc.stdout

    # another order into the same folder would make "questions needed" meaningless: refused
    proc = run_pipeline(*args(index, question_file, out, "target_correct=50", "order_seed=8"))
    assert proc.returncode == 2 and "order_seed" in proc.stderr


def test_questions_needed_counts_in_draw_order_not_finishing_order(pool):
    order = pool[:4]
    ok = {"finished": True, "em": 1.0}
    records = {order[0].id: ok, order[1].id: {"finished": True, "em": 0.0}, order[3].id: ok}
    progress = target_progress(order, records, 2, get_task("hotpotqa"))
    assert progress["questions_needed"] == 4 and progress["drawn"] == 3 and progress["reached"]
    assert not target_progress(order, records, 3, get_task("hotpotqa"))["reached"]
