"""bench/bench_server.py's code path, run tiny against STAND-INS for a continuous-batching server
(no timing is asserted: the figures come from a real llama-server, see docs/measurements.md):
the fake OpenAI endpoint at --base-url, and tests/stand_in_llama_server.py launched as the
llama-server binary (health polling, one server per run, shutdown).

    .venv/bin/python -m pytest tests/test_bench_server.py -q
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import pytest
from episode_testdata import REPO, ScriptedTeacher
from http_servers import FakeOpenAI

sys.path.insert(0, str(REPO / "bench"))
import bench_server  # noqa: E402

from pipeline.core.errors import PipelineError  # noqa: E402
from pipeline.tasks.hotpotqa.questions import load_question_set  # noqa: E402

TINY = ["--questions", "3", "--repeats", "1", "--max-in-flight", "3", "--max-steps", "3"]


def check_report(out: str) -> None:
    for schedule in ("rounds", "continuous"):
        assert re.search(rf"^\s*{schedule}: episodes/min \S+ \[", out, re.M), out
    line = out.strip().splitlines()[-1]
    assert re.match(r"continuous / rounds: \d+\.\d\dx episodes/min; identical records \(last repeat\): 3/3; "
                    r"load average ", line), out


def test_it_skips_with_one_line_when_no_llama_server_is_found(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(bench_server.ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert bench_server.main(TINY) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("skip: no llama-server found (set LLAMA_SERVER="), out


def test_a_llama_server_variable_that_names_no_executable_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(bench_server.ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(PipelineError, match="is not an executable file"):
        bench_server.main(TINY)


def test_against_a_running_server_it_prints_both_schedules_and_the_ratio(index, capsys):
    questions = load_question_set("offline-eval", limit=3)
    with FakeOpenAI(model="stand-in", latency_s=0.02) as server:
        server.replies = ScriptedTeacher(questions)
        assert bench_server.main([*TINY, "--base-url", f"{server.url}/v1", "--model", "stand-in",
                                  "--index", str(index)]) == 0
    check_report(capsys.readouterr().out)


def stand_in_binary(tmp_path: Path) -> Path:
    """An executable that runs the stand-in llama-server (as LLAMA_SERVER would name the real one)."""
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests' / 'stand_in_llama_server.py'} \"$@\"\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_it_starts_a_server_per_run_waits_until_healthy_and_stops_it(index, tmp_path, monkeypatch, capsys):
    gguf = tmp_path / "stand-in.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv(bench_server.ENV_VAR, str(stand_in_binary(tmp_path)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    assert bench_server.main([*TINY, "--gguf", str(gguf), "--index", str(index)]) == 0
    out = capsys.readouterr().out
    assert "(fresh per run, 3 slots)" in out
    check_report(out)


def test_a_server_that_never_becomes_healthy_is_a_clear_error(index, tmp_path, monkeypatch):
    gguf = tmp_path / "stand-in.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv(bench_server.ENV_VAR, str(stand_in_binary(tmp_path)))
    monkeypatch.setenv("STAND_IN_NEVER_HEALTHY", "1")
    with pytest.raises(PipelineError, match=r"llama-server not healthy at http://127\.0\.0\.1:\d+/health after 1 s"):
        bench_server.main([*TINY, "--gguf", str(gguf), "--index", str(index), "--start-timeout", "1"])
    with pytest.raises(PipelineError, match="exited with 1 before it was healthy:\n.*failed to load model"):
        bench_server.main([*TINY, "--gguf", str(tmp_path / "absent.gguf"), "--index", str(index)])
