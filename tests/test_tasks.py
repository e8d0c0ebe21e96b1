"""The task seam (pipeline/tasks/): tasks by name, what an older file without `task` means
(HotpotQA), and the environment that scores a Finish only with the metric it is given.

    .venv/bin/python -m pytest tests/test_tasks.py -q
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from episode_testdata import read_records, run_pipeline

from pipeline.core.config import to_dict
from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import Step, Trajectory, render
from pipeline.tasks import TASK_NAMES, get_task, task_of


def test_tasks_by_name_and_what_a_file_without_task_means():
    assert TASK_NAMES == ("hotpotqa", "fever")
    assert get_task().name == get_task("hotpotqa").name == "hotpotqa"
    assert get_task(get_task("fever")) is get_task("fever")
    with pytest.raises(PipelineError, match="unknown task 'fevr'; expected one of hotpotqa, fever"):
        get_task("fevr")
    assert task_of({}) == task_of({"config": {"questions": "x"}}) == task_of(None) == "hotpotqa"
    assert task_of({"task": "fever"}) == task_of({"config": {"task": "fever"}}) == "fever"


def test_hotpotqa_scores_em_and_f1_as_before():
    hotpot = get_task("hotpotqa")
    assert hotpot.scores("the Eiffel Tower", "Eiffel Tower") == {"em": 1.0, "f1": 1.0}
    assert hotpot.scores("Nixon", "Richard Nixon")["f1"] == pytest.approx(2 / 3)
    assert hotpot.scores(None, "x") == {"em": 0.0, "f1": 0.0} and hotpot.score("Paris", "paris") == 1.0


def test_a_trajectory_carries_its_question_line_and_hotpotqas_records_stay_as_written():
    hotpot = Trajectory("Who?", "react", [Step("t", "Finish[x]", "Episode finished, reward = 1")], "x")
    assert "question_label" not in hotpot.to_dict()  # HotpotQA's records: the keys they always had
    assert render(hotpot).prompt == "Question: Who?\n"
    claim = Trajectory("Paris is a city.", "standard", answer="SUPPORTS", question_label="Claim")
    assert claim.to_dict()["question_label"] == "Claim"
    assert render(Trajectory.from_dict(claim.to_dict())).text == "Claim: Paris is a city.\nAnswer: SUPPORTS\n"


def test_the_environment_scores_a_finish_only_with_the_metric_it_is_given(index):
    from pipeline.wiki.env import WikiEnv
    from pipeline.wiki.index import LocalIndex

    with LocalIndex(index) as backend:
        with pytest.raises(ValueError, match="no score="):
            WikiEnv(backend).reset("q", "Richard Nixon")
        unscored = WikiEnv(backend)
        unscored.reset("q")  # no gold answer: replay, benchmarks
        assert unscored.step("Finish[Richard Nixon]")[:2] == ("Episode finished, reward = 0", 0.0)
        fever = WikiEnv(backend, score=get_task("fever").scores)
        fever.reset("Claim text.", "NOT ENOUGH INFO")
        observation, reward, done, info = fever.step("Finish[not enough info]")
        assert (observation, reward, done) == ("Episode finished, reward = 1", 1.0, True)
        assert info == {"steps": 1, "answer": "not enough info", "em": 1.0, "f1": 1.0, "finished": True}


def test_an_unknown_task_fails_in_one_line_before_anything_is_written(tmp_path):
    proc = run_pipeline("generate", "task=fevr", "oracle=exact", f"out_dir={tmp_path / 'out'}")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(
        "unknown task 'fevr'; expected one of hotpotqa, fever")
    assert not (tmp_path / "out").exists()


def test_a_run_folder_written_before_the_task_key_resumes_and_skips_as_hotpotqas(tmp_path, index):
    from pipeline.stages.generate import GenerateConfig
    from pipeline.stages.grid.children import unit_done

    out = tmp_path / "gen"
    args = ("generate", "oracle=exact", "methods=[standard]", "questions=offline-bootstrap",
            f"wiki.index={index}", f"out_dir={out}")
    assert run_pipeline(*args, "limit=2").returncode == 0
    before = read_records(out / "standard.jsonl")
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["task"], manifest["config"]["task"]  # as a manifest written before the key
    (out / "manifest.json").write_text(json.dumps(manifest))
    cfg = replace(GenerateConfig(), out_dir=tmp_path / "done")
    older = {k: v for k, v in to_dict(cfg).items() if k != "task"}
    cfg.out_dir.mkdir()
    (cfg.out_dir / "manifest.json").write_text(json.dumps({"complete": True, "config": older}))
    assert unit_done(cfg)  # `run` skips it: it was this HotpotQA unit
    cfg.task = "fever"
    assert not unit_done(cfg)

    grown = run_pipeline(*args, "limit=3")  # resumes: one more question, the old two kept
    assert grown.returncode == 0, grown.stderr
    after = read_records(out / "standard.jsonl")
    assert len(after) == 3 and after[:2] == before  # the old records kept, byte for byte as parsed
    refused = run_pipeline(*args, "limit=3", "task=fever")
    assert refused.returncode == 2 and "with a different task" in refused.stderr
