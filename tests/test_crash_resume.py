"""Crash safety of `generate` (and the episode files `eval` shares): real `python -m pipeline
generate` processes killed with SIGKILL at random moments and resumed, torn and corrupt lines,
a second writer on the same folder, and a consumer (`filter`) refusing an incomplete run.

    .venv/bin/python -m pytest tests/test_crash_resume.py -q
    .venv/bin/python -m pytest tests/test_crash_resume.py -q -m "not slow"   # without the 600-episode loop
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from episode_testdata import (
    CORPUS,
    REPO,
    ScriptedTeacher,
    child_env,
    read_records,
    run_pipeline,
    without_timing,
    write_questions,
)
from http_servers import FakeOpenAI

METHODS = ("standard", "cot", "act", "react")

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


def oracle_args(index: Path, out: Path, *extra: str) -> list[str]:
    return ["generate", "oracle=exact", f"wiki.index={index}", f"out_dir={out}", *extra]


def line_count(out: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in out.glob("*.jsonl"))


def kill_loop(args: list[str], out: Path, kills: int, seed: int, env: dict | None = None,
              max_new_records: int = 40) -> dict:
    """Start the command again and again; each time, once it has written a random number (1 to
    max_new_records) of new records, SIGKILL it at once. Counting records rather than waiting a
    random time keeps the kills mid-run however fast the machine is. Returns what happened."""
    rng = random.Random(seed)
    log = {"killed_mid_run": 0, "finished_before_kill": 0, "torn_tails": 0, "records_at_kill": [],
           "filter_refused_incomplete": 0}
    for _ in range(kills):
        start = line_count(out) if out.exists() else 0
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=child_env(env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        target = start + rng.randint(1, max_new_records)
        while proc.poll() is None and (not out.exists() or line_count(out) < target):
            assert time.monotonic() < deadline, "no progress within 60 s"
            time.sleep(0.002)
        if proc.poll() is not None:
            log["finished_before_kill"] += 1
            continue
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        log["killed_mid_run"] += 1
        log["records_at_kill"].append(line_count(out))
        log["torn_tails"] += sum(bool(p.read_bytes()) and not p.read_bytes().endswith(b"\n")
                                 for p in out.glob("*.jsonl"))
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["complete"] is False  # a killed run never claims to be complete
        if log["filter_refused_incomplete"] == 0:
            refused = run_pipeline("filter", f"inputs=[{out}]", f"out_dir={out.parent / 'sft'}")
            assert refused.returncode == 2 and "incomplete" in refused.stderr, refused.stderr
            assert not (out.parent / "sft").exists()
            log["filter_refused_incomplete"] += 1
    return log


def assert_same_records(reference: Path, resumed: Path, methods=METHODS) -> int:
    """Same ids per method, no duplicates, nothing missing, identical apart from timing."""
    total = 0
    for method in methods:
        ref = read_records(reference / f"{method}.jsonl")
        got = read_records(resumed / f"{method}.jsonl")  # raises on any corrupt line
        ids = [r["id"] for r in got]
        assert len(ids) == len(set(ids)), f"{method}: duplicates"
        assert set(ids) == {r["id"] for r in ref}, f"{method}: missing or extra ids"
        by_id = {r["id"]: without_timing(r) for r in ref}
        for r in got:
            assert without_timing(r) == by_id[r["id"]], (method, r["id"])
        total += len(got)
    assert json.loads((resumed / "manifest.json").read_text())["complete"] is True
    return total


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(index, tmp_path):
    """The oracle teacher over 150 bootstrap questions x 4 methods (600 episodes, each record
    fsynced), killed 6 times. Slow-marked: ~16 s idle, but fsync-bound, so it varies with the disk."""
    args = ["questions=offline-bootstrap", "limit=150"]
    reference = tmp_path / "reference"
    proc = run_pipeline(*oracle_args(index, reference, *args))
    assert proc.returncode == 0, proc.stderr
    resumed = tmp_path / "resumed"
    log = kill_loop(oracle_args(index, resumed, *args), resumed, kills=6, seed=1)
    # 6 x at most 40 new records stays below 600: every kill lands mid-run
    assert log["killed_mid_run"] == 6 and log["finished_before_kill"] == 0, log
    assert log["records_at_kill"] == sorted(log["records_at_kill"])  # kept, never lost
    proc = run_pipeline(*oracle_args(index, resumed, *args))
    assert proc.returncode == 0, proc.stderr
    assert assert_same_records(reference, resumed) == 600
    print(f"\nSIGKILL loop (oracle): {log}")


def test_sigkill_of_an_llm_teacher_run_then_resume_equals_an_uninterrupted_run(index, tmp_path):
    """A real HTTP teacher (scripted, deterministic) with a per-request delay, killed 4 times."""
    from pipeline.tasks.hotpotqa.questions import load_question_set

    questions = load_question_set("offline-eval", limit=24)
    qfile = write_questions(tmp_path / "q.jsonl", questions)
    with FakeOpenAI(model="scripted", latency_s=0.02) as server:
        server.replies = ScriptedTeacher(questions)
        args = ["generate", "teacher.backend=openai", "teacher.model=scripted",
                f"teacher.base_url={server.url}/v1", f"questions={qfile}", f"wiki.index={index}",
                "max_in_flight=2", "teacher.max_concurrency=2"]
        reference = tmp_path / "reference"
        proc = run_pipeline(*args, f"out_dir={reference}")
        assert proc.returncode == 0, proc.stderr
        resumed = tmp_path / "resumed"
        log = kill_loop([*args, f"out_dir={resumed}"], resumed, kills=4, seed=2, max_new_records=15)
        # 4 x at most 15 new records stays below 96: every kill lands mid-run
        assert log["killed_mid_run"] == 4 and log["finished_before_kill"] == 0, log
        assert log["records_at_kill"] == sorted(log["records_at_kill"])
        proc = run_pipeline(*args, f"out_dir={resumed}")
        assert proc.returncode == 0, proc.stderr
    assert assert_same_records(reference, resumed) == 4 * 24
    print(f"\nSIGKILL loop (HTTP teacher): {log}")


@pytest.fixture
def small_run(index, tmp_path):
    """A finished react run over 4 questions, and the arguments to extend it to 5."""
    out = tmp_path / "run"
    base = oracle_args(index, out, "questions=offline-eval", "methods=[react]")
    assert run_pipeline(*base, "limit=4").returncode == 0
    return out, [*base, "limit=5"]


def test_a_torn_last_line_is_dropped_and_rewritten_on_resume(small_run):
    out, args = small_run
    path = out / "react.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])  # a kill mid-write
    proc = run_pipeline(*args)
    assert proc.returncode == 0, proc.stderr
    records = read_records(path)  # every line is valid JSON again
    assert len(records) == 5 and len({r["id"] for r in records}) == 5
    assert path.read_bytes().startswith(b"".join(lines[:3]))
    assert without_timing(records[3]) == without_timing(json.loads(lines[3]))


def test_a_whole_last_record_without_its_newline_is_not_lost(small_run):
    """The record parses but its newline never reached the disk: the appender cuts such a line,
    so resume must count it as not done (it is run again, not lost)."""
    out, args = small_run
    path = out / "react.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    proc = run_pipeline(*args)
    assert proc.returncode == 0, proc.stderr
    records = read_records(path)
    assert len(records) == 5 and len({r["id"] for r in records}) == 5


def test_a_corrupt_line_before_the_end_is_refused_with_its_line_number(small_run):
    out, args = small_run
    path = out / "react.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1][:40] + b"\n"
    path.write_bytes(b"".join(lines))
    before = path.read_bytes()
    proc = run_pipeline(*args)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()  # one line, naming the file and the line
    assert line.startswith(f"error: {path}:2: not valid JSON") and line.endswith("fix or delete that line")
    assert path.read_bytes() == before


def test_a_second_writer_on_the_same_folder_is_refused(small_run):
    out, args = small_run
    before = (out / "react.jsonl").read_bytes()
    with open(out / ".lock", "a+") as fh:  # another process holds the folder
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.truncate(0)
        fh.write("12345")
        fh.flush()
        proc = run_pipeline(*args)
    assert proc.returncode == 2
    assert "is being written by another process (pid 12345)" in proc.stderr
    assert (out / "react.jsonl").read_bytes() == before
    proc = run_pipeline(*args)  # the lock is gone with its holder: the run goes on
    assert proc.returncode == 0 and len(read_records(out / "react.jsonl")) == 5


def test_filter_refuses_a_run_whose_manifest_says_incomplete(small_run, tmp_path):
    out, _ = small_run
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    proc = run_pipeline("filter", f"inputs=[{out}]", f"out_dir={tmp_path / 'sft'}")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: generate output {out}: {out / 'manifest.json'} says the run "
                                   "that wrote it is incomplete; re-run that stage to finish it")
    assert not (tmp_path / "sft").exists()


def test_a_killed_eval_leaves_no_stale_summary_and_resumes(index, tmp_path):
    """eval over 2 questions completes; extended to 12 it is SIGKILLed mid-run: the old summary
    is gone (not plotted as the new run's), the manifest says incomplete; a re-run completes."""
    from pipeline.tasks.hotpotqa.questions import load_question_set

    questions = load_question_set("offline-eval", limit=12)
    qfile = write_questions(tmp_path / "q.jsonl", questions)
    out = tmp_path / "eval"
    with FakeOpenAI(model="slow", latency_s=0.05) as server:
        server.replies = ScriptedTeacher(questions)
        args = ["eval", "model.backend=openai", "model.model=slow", f"model.base_url={server.url}/v1",
                "size_class=8b", "params_b=8", f"questions={qfile}", f"wiki.index={index}",
                f"out_dir={out}", "methods=[react]", "max_in_flight=1"]
        assert run_pipeline(*args, "limit=2").returncode == 0
        assert json.loads((out / "summary.json").read_text())[0]["n"] == 2
        log = kill_loop([*args, "limit=12"], out, kills=1, seed=3, max_new_records=4)
        assert log["killed_mid_run"] == 1, log
        assert not (out / "summary.json").exists()
        assert 2 < len(read_records(out / "react.jsonl")) < 12
        proc = run_pipeline(*args, "limit=12")
        assert proc.returncode == 0, proc.stderr
    records = read_records(out / "react.jsonl")
    assert sorted(r["id"] for r in records) == sorted(q.id for q in questions)
    [row] = json.loads((out / "summary.json").read_text())
    assert (row["n"], row["em"]) == (12, 1.0)
