"""Runs whose episodes end in backend errors: past `max_error_share` a unit stops in one line and
writes no summary (nor a complete manifest); a re-run runs the errored episodes again. Against a
real HTTP server on 127.0.0.1 that answers 503 (tests/http_servers.FakeOpenAI), through a real
`python -m pipeline eval` process and the generate stage.

    .venv/bin/python -m pytest tests/test_backend_errors.py -q
"""

from __future__ import annotations

import json

import pytest
from episode_testdata import CORPUS, ScriptedTeacher, read_records, run_pipeline, write_questions
from http_servers import FakeOpenAI, Fault

from pipeline.core.trajectory import one_line

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@pytest.fixture(scope="module")
def questions():
    from pipeline.tasks.hotpotqa.questions import load_question_set

    return load_question_set("offline-eval", limit=6)


def posts_for(server: FakeOpenAI, questions: list) -> list[str]:
    """The ids of the questions whose prompts reached the server, in the order they came."""
    by_text = {one_line(q.question): q.id for q in questions}
    return [next(i for text, i in by_text.items() if f"Question: {text}\n" in r.body["prompt"])
            for r in server.requests if r.method == "POST"]


def test_an_eval_of_mostly_errors_stops_without_a_summary_and_a_rerun_retries_the_errored_episodes(
        tmp_path, index, questions):
    out = tmp_path / "eval"
    failing = [questions[i] for i in (0, 2, 3, 5)]
    with FakeOpenAI(model="big-model") as server:
        server.replies = ScriptedTeacher(questions)
        for q in failing:
            server.fail_prompt(one_line(q.question), Fault("503"))
        args = ("eval", "model.backend=openai", "model.model=big-model", f"model.base_url={server.url}/v1",
                "model.max_retries=0", "size_class=70b", "params_b=70.6", "methods=[standard]",
                f"questions={write_questions(tmp_path / 'q.jsonl', questions)}", f"wiki.index={index}",
                f"out_dir={out}", "max_in_flight=1", "max_error_share=0.5")

        # 1. 4 of 6 episodes fail (0.5 allows 3): exit 2, one line naming the first error.
        stopped = run_pipeline(*args)
        assert stopped.returncode == 2, stopped.stderr
        [line] = stopped.stderr.strip().splitlines()
        assert line.startswith(f"error: {out / 'standard.jsonl'}: 4 of 6 episodes ended in a model or page-source "
                               "error, more than max_error_share=0.5 allows (the first: llm_error: POST "), line
        assert "HTTP 503" in line and "the errored episodes are run again" in line
        assert not (out / "summary.json").exists()
        assert json.loads((out / "manifest.json").read_text())["complete"] is False
        records = read_records(out / "standard.jsonl")  # the records stay
        assert [r["id"] for r in records if r["end_reason"].startswith("llm_error: ")] == [q.id for q in failing]
        assert len(records) == 6

        # 2. The server mended but for one question: the 4 errored episodes run again (and only
        # they); the one that fails again is within the share: a summary that counts it wrong.
        server.requests.clear()
        server.fail_prompt(one_line(questions[0].question), Fault("503"))
        mostly = run_pipeline(*args)
        assert mostly.returncode == 0, mostly.stderr
        assert posts_for(server, questions) == [q.id for q in failing]
        [row] = json.loads((out / "summary.json").read_text())
        assert (row["n"], row["errors"], row["em"]) == (6, 1, pytest.approx(5 / 6))
        assert "1 ended in a backend error (counted wrong)" in mostly.stdout

        # 3. Mended: the last errored episode runs again; every record is a model's answer now.
        server.requests.clear()
        mended = run_pipeline(*args)
        assert mended.returncode == 0, mended.stderr
        assert posts_for(server, questions) == [questions[0].id]
    records = read_records(out / "standard.jsonl")
    assert sorted(r["id"] for r in records) == sorted(q.id for q in questions)
    assert all(r["end_reason"] == "finish" and r["em"] == 1.0 for r in records)
    [row] = json.loads((out / "summary.json").read_text())
    assert (row["n"], row["errors"], row["em"]) == (6, 0, 1.0)
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    set_aside = read_records(out / "errored" / "standard.jsonl")  # kept for reading, never read back
    assert [r["id"] for r in set_aside] == [q.id for q in failing] + [questions[0].id]


def test_a_teacher_that_errors_stops_generate_in_target_mode_and_the_rerun_draws_the_errored_questions_again(
        tmp_path, index, questions):
    from pipeline.agent.episodes import ErrorShareExceeded
    from pipeline.core.storage import read_manifest
    from pipeline.llm.config import LLMConfig
    from pipeline.stages.generate import GenerateConfig, draw_order, generate
    from pipeline.wiki.config import WikiConfig

    out = tmp_path / "gen"
    with FakeOpenAI(model="teacher") as server:
        server.replies = ScriptedTeacher(questions)
        server.fail_prompt("Question: ", *[Fault("503")] * 100)  # down for every episode
        cfg = GenerateConfig(
            teacher=LLMConfig(backend="openai", model="teacher", base_url=f"{server.url}/v1", max_retries=0),
            methods=["act"], questions=str(write_questions(tmp_path / "q.jsonl", questions)), out_dir=out,
            wiki=WikiConfig(index=index), max_in_flight=2, target_correct=3)
        with pytest.raises(ErrorShareExceeded, match=r"act.jsonl: 1 of 3 episodes ended in a model or page-source "
                           r"error, more than max_error_share=0.1 allows \(the first: llm_error: POST "):
            generate(cfg)
        assert read_manifest(out / "manifest.json")["complete"] is False
        errored = {r["id"] for r in read_records(out / "act.jsonl")}
        assert errored and all(r["end_reason"].startswith("llm_error") for r in read_records(out / "act.jsonl"))

        server.prompt_faults.clear()
        server.requests.clear()
        stats = generate(cfg)
    order = [q.id for q in draw_order(questions, cfg.order_seed)]
    assert stats["act"]["target"]["reached"] and stats["act"]["errors"] == 0
    assert set(order[:3]) >= errored  # drawn again, in their place in the seeded order
    assert {r["id"] for r in read_records(out / "act.jsonl")} == set(order[:3])
    assert read_manifest(out / "manifest.json")["complete"] is True
