"""The `generate` stage end to end, as a real `python -m pipeline generate` process: the oracle
teacher over the real local index, a scripted teacher behind the fake OpenAI-compatible server
on 127.0.0.1, resume, and bad configs (exit 2, one line, nothing written).

    .venv/bin/python -m pytest tests/test_generate.py -q
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import replace

import pytest
from episode_testdata import (
    CORPUS,
    EPISODE_FIELDS,
    ScriptedTeacher,
    read_records,
    run_pipeline,
    write_questions,
)
from http_servers import FakeOpenAI

from pipeline.core.trajectory import Trajectory, parse, render

METHODS = ("standard", "cot", "act", "react")
MISSING_TITLE = "No Such Page At All 4711"

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@pytest.fixture(scope="module")
def questions():
    """5 offline-eval questions (gold pages in the corpus) + one whose gold page is not."""
    from pipeline.tasks.hotpotqa.questions import load_question_set

    qs = load_question_set("offline-eval", limit=6)
    qs[5] = replace(qs[5], id="no-page", supporting_facts=[[MISSING_TITLE, 0]])
    return qs


@pytest.fixture(scope="module")
def question_file(tmp_path_factory, questions):
    return write_questions(tmp_path_factory.mktemp("q") / "questions.jsonl", questions)


def oracle_args(index, question_file, out_dir, *extra):
    return ("generate", "oracle=exact", f"questions={question_file}",
            f"wiki.index={index}", f"out_dir={out_dir}", *extra)


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory, index, question_file):
    out = tmp_path_factory.mktemp("gen") / "oracle"
    proc = run_pipeline(*oracle_args(index, question_file, out))
    assert proc.returncode == 0, proc.stderr
    return out, proc


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_oracle_writes_every_method_with_the_record_fields(oracle_run, questions):
    out, proc = oracle_run
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{m}.jsonl" for m in METHODS] + ["manifest.json", ".lock"])
    for method in METHODS:
        records = read_records(out / f"{method}.jsonl")
        assert [r["id"] for r in records] == [q.id for q in questions]
        for r, q in zip(records, questions, strict=True):
            assert set(r) == EPISODE_FIELDS, set(r) ^ EPISODE_FIELDS
            assert (r["method"], r["teacher"], r["source"]) == (method, "oracle", "generate")
            assert (r["question"], r["gold_answer"]) == (q.question, q.answer)
            traj = Trajectory.from_dict(r["trajectory"])
            assert r["text"] == render(traj).text
            if r["finished"]:  # (an unanswered CoT renders "Answer: " and parses back as "")
                assert parse(r["text"], method) == traj
            assert r["n_steps"] == len(r["steps"]) == len(traj.steps)
            assert isinstance(r["seconds"], float) and r["prompt_tokens"] == r["completion_tokens"] == 0
            if q.id == "no-page" and method != "standard":  # no evidence: no answer
                assert r["end_reason"] == f"oracle_missing_page: {MISSING_TITLE}"
                assert (r["prediction"], r["em"], r["finished"]) == (None, 0.0, False)
            else:
                assert (r["end_reason"], r["prediction"], r["em"], r["f1"], r["finished"]) == \
                    ("finish", q.answer, 1.0, 1.0, True)
        if method in ("act", "react"):
            assert all(r["steps"][0]["action"] == f"Search[{r_q.gold_titles[0]}]"
                       for r, r_q in zip(records, questions, strict=True))
    assert f"react: 6 episodes, EM {5 / 6:.3f}" in proc.stdout


def test_the_manifest_records_config_teacher_and_versions(oracle_run):
    out, _ = oracle_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["stage"] == "generate"
    assert manifest["teacher"] == "oracle" and manifest["n_questions"] == 6
    assert manifest["config"]["oracle"] == "exact"
    assert manifest["exemplar_sources"]["react"] == {"source": "oracle (gold supporting facts)"}
    assert {"python", "torch", "transformers"} <= set(manifest["packages"])
    assert manifest["stats"]["react"]["n"] == 6 and manifest["stats"]["react"]["em"] == pytest.approx(5 / 6)


def test_a_rerun_appends_nothing_and_another_question_file_is_refused(oracle_run, index, questions,
                                                                      question_file, tmp_path):
    out, _ = oracle_run
    before = snapshot(out)
    proc = run_pipeline(*oracle_args(index, question_file, out))
    assert proc.returncode == 0, proc.stderr
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k.endswith(".jsonl")} == \
        {k: v for k, v in before.items() if k.endswith(".jsonl")}
    assert json.loads(after["manifest.json"])["complete"] is True
    # A different question FILE is a different question set: refused, nothing touched.
    other = write_questions(tmp_path / "other.jsonl", questions[:2])
    proc = run_pipeline(*oracle_args(index, other, out))
    assert proc.returncode == 2 and "different questions" in proc.stderr
    assert snapshot(out) == after


def test_a_larger_limit_appends_only_the_new_questions(index, tmp_path):
    out = tmp_path / "lim"
    base = ("generate", "oracle=exact", "questions=offline-eval", f"wiki.index={index}",
            f"out_dir={out}", "methods=[react,cot]")
    assert run_pipeline(*base, "limit=3").returncode == 0
    first = (out / "react.jsonl").read_bytes()
    proc = run_pipeline(*base, "limit=5")
    assert proc.returncode == 0, proc.stderr
    react = read_records(out / "react.jsonl")
    assert (out / "react.jsonl").read_bytes().startswith(first)
    assert len(react) == 5 and len({r["id"] for r in react}) == 5
    assert "react: 5 episodes" in proc.stdout


def test_a_different_teacher_into_the_same_folder_is_refused(oracle_run, index, question_file):
    out, _ = oracle_run
    before = snapshot(out)
    for override in ("oracle=null", "prompting.max_steps=5", "wiki.backend=live"):
        proc = run_pipeline(*oracle_args(index, question_file, out), override)
        assert proc.returncode == 2, (override, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "holds a generate run with a different" in lines[0]
    assert snapshot(out) == before


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("overrides,message", [
    (["limt=3"], "unknown key 'limt'; did you mean 'limit'?"),
    (["teacher.backnd=x"], "unknown key 'teacher.backnd'; did you mean 'teacher.backend'?"),
    (["methods=[react,reactt]"], "unknown method 'reactt'"),
    (["oracle=exact", "methods=[cot_sc]"], "the oracle teacher writes"),
    (["teacher.backend=tpu"], "unknown backend 'tpu'"),
    (["teacher.model=/nonexistent/model-dir"], "/nonexistent/model-dir not found"),
    (["teacher.backend=openai", "teacher.base_url=http://127.0.0.1:{port}/v1", "teacher.ready_timeout_s=0"],
     "endpoint unavailable"),
    (["wiki.backend=cloud"], "wiki.backend 'cloud' is unknown"),
    (["wiki.search=bm3"], "'wiki.search' must be title or bm25, got 'bm3'"),
    (["wiki.search_k=0"], "'wiki.search_k' must be >= 1, got 0"),
    (["wiki.search=bm25", "wiki.backend=live"], "wiki.search=bm25 ranks the pages of a local index"),
    (["task=fever", "questions=offline-eval", "wiki.search=bm25"], "wiki.search=bm25 does not apply to FEVER"),
    (["oracle=exact", "wiki.search=bm25"], "oracle=exact searches the gold titles"),
    (["methods=[rag]"], "method rag retrieves with the question, which wiki.search=title cannot"),
    (["questions=no-such-set"], "unknown question set 'no-such-set'"),
    (["limit=-1"], "'limit' must be >= 1, got -1"),
    (["limit=0"], "'limit' must be >= 1, got 0"),  # was "question set ... is empty" (issue 39)
    (["max_in_flight=zero"], "'max_in_flight' must be int"),
])
def test_bad_config_exits_2_with_one_line_and_writes_nothing(tmp_path, index, overrides, message):
    out = tmp_path / "never"
    overrides = [o.replace("{port}", str(closed_port())) for o in overrides]
    proc = run_pipeline("generate", "questions=offline-eval", "limit=2", f"wiki.index={index}",
                        f"out_dir={out}", "teacher.timeout_s=2", *overrides)
    assert proc.returncode == 2, proc.stderr
    # One error line, last; only a retry warning of the endpoint probe may come before it.
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    assert all("retry" in line for line in lines[:-1]), proc.stderr
    assert message in errors[0]
    assert not out.exists()


def test_a_scripted_llm_teacher_through_the_openai_endpoint_writes_trajectories(tmp_path, index, questions):
    """A real LLM backend (HTTP, completions) against a deterministic scripted server."""
    real = questions[:4]
    qfile = write_questions(tmp_path / "q.jsonl", real)
    out = tmp_path / "llm"
    with FakeOpenAI(model="scripted-teacher") as server:
        server.replies = ScriptedTeacher(real)
        proc = run_pipeline("generate", "teacher.backend=openai", "teacher.model=scripted-teacher",
                            f"teacher.base_url={server.url}/v1", f"questions={qfile}",
                            f"wiki.index={index}", f"out_dir={out}")
        prompts = list(server.replies.prompts)
    assert proc.returncode == 0, proc.stderr
    # Against a server, episodes run continuously: records come in finishing order, not question order.
    position = {q.id: i for i, q in enumerate(real)}
    for method in METHODS:
        records = sorted(read_records(out / f"{method}.jsonl"), key=lambda r: position[r["id"]])
        assert [r["id"] for r in records] == [q.id for q in real]
        for r, q in zip(records, real, strict=True):
            assert set(r) == EPISODE_FIELDS
            assert (r["teacher"], r["end_reason"], r["em"], r["prediction"]) == \
                ("scripted-teacher", "finish", 1.0, q.answer), r
            assert r["prompt_tokens"] > 0 and r["completion_tokens"] > 0
            traj = Trajectory.from_dict(r["trajectory"])
            assert r["text"] == render(traj).text
    react = sorted(read_records(out / "react.jsonl"), key=lambda r: position[r["id"]])
    for r, q in zip(react, real, strict=True):
        assert [s["action"] for s in r["steps"]] == [f"Search[{q.gold_titles[0]}]", f"Finish[{q.answer}]"]
        assert r["steps"][0]["thought"] == "I need step 1."
        # The observation is the environment's, not the text the model invented after its action.
        assert "invented" not in r["text"] and r["steps"][1]["observation"] == "Episode finished, reward = 1"
    # Prompted mode: every prompt starts with the instruction and the 6 exemplars.
    assert prompts and all(p.count("Question: ") == 7 for p in prompts)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["teacher"] == "scripted-teacher" and manifest["complete"]
    assert manifest["exemplar_sources"]["react"]["react"].startswith("ours:")


def test_the_teacher_waits_for_an_endpoint_that_comes_up_late(tmp_path, index, questions):
    """The recipe's `vllm serve ... &` then `generate` at once: the port refuses connections for
    a few seconds (the server still loading), then a real server answers there. Before issue 46,
    generate stopped in 1-2 s with "endpoint unavailable"."""
    real = questions[:2]
    qfile = write_questions(tmp_path / "q.jsonl", real)
    out = tmp_path / "late"
    port = closed_port()
    servers = []

    def come_up():  # binds the port only now: until then a connection is refused
        server = FakeOpenAI(model="scripted-teacher", port=port)
        server.replies = ScriptedTeacher(real)
        servers.append(server.__enter__())

    starter = threading.Timer(5.0, come_up)  # 5 s after the stage started
    starter.start()
    try:
        proc = run_pipeline("generate", "teacher.backend=openai", "teacher.model=scripted-teacher",
                            f"teacher.base_url=http://127.0.0.1:{port}/v1", "teacher.ready_timeout_s=120",
                            f"questions={qfile}", f"wiki.index={index}", f"out_dir={out}", "methods=[react]")
    finally:
        starter.join()
        for server in servers:
            server.__exit__(None, None, None)
    assert proc.returncode == 0, proc.stderr
    url = f"http://127.0.0.1:{port}/v1/models"
    assert f"[endpoint] waiting for {url} to answer: 0 s of 120 s (llm.ready_timeout_s); last: " in proc.stdout
    assert f"[endpoint] {url} answered after " in proc.stdout
    assert len(read_records(out / "react.jsonl")) == 2


def test_an_endpoint_that_never_comes_up_is_one_line_after_ready_timeout_s(tmp_path, index, question_file):
    port = closed_port()
    out = tmp_path / "never"
    proc = run_pipeline("generate", "teacher.backend=openai", f"teacher.base_url=http://127.0.0.1:{port}/v1",
                        "teacher.ready_timeout_s=3", f"questions={question_file}", f"wiki.index={index}",
                        f"out_dir={out}")
    assert proc.returncode == 2, proc.stderr
    *notes, error = proc.stderr.strip().splitlines()  # one error; before it at most the index-coverage note
    assert all(note.startswith("warning: wiki.index") for note in notes) and len(notes) <= 1, proc.stderr
    assert error.startswith(f"error: OpenAI-compatible endpoint unavailable: GET http://127.0.0.1:{port}/v1/models")
    assert "(waited 3 s, llm.ready_timeout_s)" in error and "start the server" in error
    assert "[endpoint] waiting for" in proc.stdout
    assert not out.exists()
