"""Inputs and runs that lost data or gave silently wrong results (issue 46, "data lost or
silently wrong"): a second training into a folder being trained, an eval prompting style that was
ignored, a filter input that dropped a method without a word, training and evaluation questions
that overlap, a task run against another task's index, and the stand-in teacher asked for a set
it cannot answer. Each case runs the real CLI (`python -m pipeline ...`) but one, labelled, that
runs in process; each failed before its fix.

    .venv/bin/python -m pytest tests/test_silently_wrong.py -n 0 -q
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from episode_testdata import REPO, child_env, run_pipeline
from sft_testdata import fireact_records, write_dataset
from test_first_use import refused  # exit 2, one `error:` line matching, no traceback

TINY = "configs/students/tiny.yaml"


# ------------------------------------------------------------------- 1. one training per folder


@pytest.mark.slow
def test_a_second_training_into_a_folder_being_trained_is_refused_and_touches_nothing(tmp_path):
    """A second `train` (or `run --only train`) on the folder of a running training moved the
    first's in-progress checkpoint aside as incomplete and restarted from step 0 under it."""
    runs = tmp_path / "runs"
    write_dataset(runs / "sft", "react", fireact_records(40, 1500))
    output = tmp_path / "ckpt" / "lk" / "tiny" / "react"
    args = ["train", "--config", TINY, f"dataset_dir={runs / 'sft'}", f"output_dir={output}",
            "max_steps=1000", "save_steps=2", "accelerate_config=cpu", "report_to=none"]
    first = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=child_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list(output.glob("checkpoint-*")) and time.monotonic() < deadline:
            assert first.poll() is None, "the first training stopped"
            time.sleep(1)
        assert list(output.glob("checkpoint-*")), "the first training wrote no checkpoint in 300 s"
        config = (output / "finetune_config.yaml").read_bytes()
        holder = rf"{re.escape(str(output))} is being written by another process \(pid {first.pid}\); .*output_dir$"
        # each second training differs in a harmless value, so a resolved config rewritten before
        # the lock is taken would not be the first's bytes again
        refused(run_pipeline(*args, "logging_steps=7", timeout=120), holder)
        assert (output / "finetune_config.yaml").read_bytes() == config, "the direct train rewrote the config"
        grid = tmp_path / "grid.yaml"
        grid.write_text(yaml.safe_dump({
            "experiment": "lk", "out_dir": str(runs), "formats": ["react"],
            "train": {"output_root": str(tmp_path / "ckpt"), "max_steps": 1000, "save_steps": 2,
                      "accelerate_config": "cpu", "report_to": "none", "logging_steps": 9},
            "students": [{"name": "tiny", "config": TINY, "size_class": "tiny", "params_b": 0.003}]}))
        refused(run_pipeline("run", "--config", str(grid), "--only", "train", timeout=120),
                r"training tiny on react: " + holder)
        assert first.poll() is None, "the first training died"
        assert (output / "finetune_config.yaml").read_bytes() == config, "run --only train rewrote the config"
        assert not list(output.glob("incomplete-checkpoint-*")), "a checkpoint of the first was set aside"
    finally:
        stop_tree(first)


def test_a_grpo_into_a_folder_being_written_is_refused_before_its_config_is_rewritten(tmp_path, index):
    """`grpo` held no lock either. The holder here is this test process (as in
    tests/test_crash_resume.py's second writer), not a running GRPO: an flock is the same."""
    import fcntl

    out = tmp_path / "grpo"
    out.mkdir()
    with open(out / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.write("12345")
        fh.flush()
        proc = run_pipeline("grpo", "--config", "configs/grpo/smollm2-135m.yaml", "student=smollm2", "max_steps=1",
                            f"output_dir={out}", f"wiki.index={index}", "accelerate_config=cpu", timeout=300)
    refused(proc, rf"{re.escape(str(out))} is being written by another process \(pid 12345\); .*output_dir$")
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def stop_tree(proc: subprocess.Popen) -> None:
    """Ctrl-C to a `train` process (its launcher then stops the workers it started in their own
    process groups), and a kill for whatever of its tree is still there a minute later."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    proc.send_signal(signal.SIGINT)
    psutil.wait_procs(tree, timeout=60)
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    proc.wait(10)


# --------------------------------------------------------------- 2. eval's prompting.style


@pytest.mark.parametrize("style, questions_in_prompt", [("zero_shot", 1), ("prompt", 7)])
def test_eval_sends_the_prompting_style_it_is_given_and_records_it(tmp_path, index, style, questions_in_prompt):
    """`style=zero_shot` sent the same 6-shot prompt as `style=prompt`, and the manifest said zero_shot."""
    from episode_testdata import ScriptedTeacher
    from http_servers import FakeOpenAI

    from pipeline.tasks.hotpotqa.questions import load_question_set

    out = tmp_path / "eval"
    with FakeOpenAI(model="big-model") as server:
        server.replies = ScriptedTeacher(load_question_set("offline-eval", limit=2))
        proc = run_pipeline("eval", "model.backend=openai", "model.model=big-model", f"model.base_url={server.url}/v1",
                            "size_class=70b", "params_b=70.6", "limit=2", "methods=[standard]",
                            f"prompting.style={style}", f"wiki.index={index}", f"out_dir={out}")
        prompts = [r.body["prompt"] for r in server.requests if isinstance(r.body, dict) and "prompt" in r.body]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(prompts) == 2 and all(p.count("Question:") == questions_in_prompt for p in prompts), prompts
    manifest = yaml.safe_load((out / "manifest.json").read_text())
    assert manifest["style"] == style and manifest["config"]["prompting"]["style"] == style


def test_an_unknown_eval_prompting_style_is_refused_before_anything_runs(tmp_path):
    """An unknown style ran to the end (the style was never read)."""
    proc = run_pipeline("eval", "oracle=exact", "size_class=1b", "params_b=1", "limit=1",
                        "prompting.style=few_shot", f"out_dir={tmp_path / 'eval'}")
    refused(proc, r"unknown prompting style 'few_shot' \(prompting.style\); expected one of prompt, zero_shot, fireact$")
    assert not (tmp_path / "eval").exists()


def test_a_fine_tuned_model_decodes_in_its_own_style_and_refuses_another():
    """In process (a stand-in target, no model read): the default style means "its own"; another
    style than its own is refused instead of being recorded and not sent."""
    from pipeline.core.errors import PipelineError
    from pipeline.llm.config import LLMConfig
    from pipeline.stages.eval import ModelUnderTest, sent_style

    student = ModelUnderTest(LLMConfig(), "tiny-react", "finetune", "tiny", 0.003, "react", decode_style="zero_shot")
    assert sent_style("prompt", student) == sent_style("zero_shot", student) == "zero_shot"
    with pytest.raises(PipelineError, match=r"prompting.style=fireact: tiny-react is fine-tuned .*\(zero_shot\)"):
        sent_style("fireact", student)


# -------------------------------------------------------- 3. a method lost from filter's input


@pytest.fixture(scope="module")
def two_method_generate(tmp_path_factory) -> Path:
    """A finished oracle generate of react and act, 4 questions each (its manifest counts 4 of each)."""
    folder = tmp_path_factory.mktemp("generate") / "gen"
    proc = run_pipeline("generate", "oracle=exact", "limit=4", "methods=[react,act]", f"out_dir={folder}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


@pytest.mark.parametrize("damage, state", [("empty", "is empty"), ("missing", "is missing"), ("cut", "holds 2 episodes")])
def test_filter_refuses_a_method_file_that_lost_the_episodes_its_manifest_counts(two_method_generate, tmp_path,
                                                                                  damage, state):
    """An emptied or deleted act.jsonl was dropped with exit 0 and no note: only react's dataset."""
    import shutil

    folder = tmp_path / "gen"
    shutil.copytree(two_method_generate, folder)
    act = folder / "act.jsonl"
    lines = act.read_text(encoding="utf-8").splitlines(keepends=True)
    if damage == "missing":
        act.unlink()
    else:
        act.write_text("".join(lines[:2]) if damage == "cut" else "", encoding="utf-8")
    proc = run_pipeline("filter", f"inputs=[{folder}]", f"out_dir={tmp_path / 'sft'}")
    refused(proc, rf"{re.escape(str(act))} {state}, but .*manifest.json counts 4 act episodes; re-run the same "
                  rf"generate into .*formats=\[react\]$")
    assert not (tmp_path / "sft").exists()
    left_out = run_pipeline("filter", f"inputs=[{folder}]", f"out_dir={tmp_path / 'sft'}", "formats=[react]")
    assert left_out.returncode == 0, left_out.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "sft").iterdir() if p.is_dir()) == ["react"]


# ------------------------------------------------- 5. the stand-in teacher on a set it cannot answer

ORACLE_CAN = r"use questions= one of offline-eval, offline-bootstrap, dev, train, hf:<distractor\|fullwiki>:<train\|validation> \(or a file with them\), or a model$"


@pytest.mark.parametrize("stage", ["generate", "eval", "run"])
def test_the_oracle_on_a_set_without_gold_facts_is_one_line_naming_the_sets_it_can_answer(tmp_path, stage):
    """`oracle=exact questions=react-dev500` ended in an IndexError and left an incomplete run."""
    out = tmp_path / "out"
    if stage == "run":
        grid = tmp_path / "grid.yaml"
        grid.write_text(yaml.safe_dump({"experiment": "dev", "out_dir": str(out), "formats": ["react"],
                                        "generate": {"oracle": "exact", "questions": "react-dev500"}}))
        proc = run_pipeline("run", "--config", str(grid), "--print-config")
    else:
        extra = ["size_class=1b", "params_b=1"] if stage == "eval" else []
        proc = run_pipeline(stage, "oracle=exact", "questions=react-dev500", "limit=2", "methods=[react]",
                            f"out_dir={out}", *extra)
    refused(proc, r"the oracle teacher writes each trajectory from a question's gold supporting facts, and "
                  r"questions=react-dev500 has no gold supporting facts; " + ORACLE_CAN)
    assert not out.exists()


def test_the_oracle_on_a_file_of_questions_without_gold_facts_names_how_many_and_the_first(tmp_path):
    from dataclasses import replace

    from episode_testdata import write_questions

    from pipeline.tasks.hotpotqa.questions import load_question_set

    questions = load_question_set("offline-eval", limit=3)
    path = write_questions(tmp_path / "q.jsonl", [questions[0], replace(questions[1], supporting_facts=[]), questions[2]])
    proc = run_pipeline("generate", "oracle=exact", f"questions={path}", "methods=[react]", f"out_dir={tmp_path / 'out'}")
    refused(proc, rf"1 of the 3 questions of {re.escape(str(path))} have no gold supporting facts "
                  rf"\(first: {re.escape(questions[1].id)}\); " + ORACLE_CAN)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------ 4. training and evaluation questions kept apart

APART = r": a score over questions trained on measures recall; .* or set allow_question_overlap=true if this is meant$"


@pytest.mark.parametrize("config, overrides, leak", [
    ("configs/demo.yaml", ["generate.questions=offline-eval"], "eval.questions=offline-eval is the training set itself"),
    ("configs/demo.yaml", ["generate.questions=dev", "generate.limit=null", "eval.questions=react-dev500"],
     r"eval.questions=react-dev500 shares 16 of its 16 questions with the training set \(dev\)"),
    ("configs/small-rounds.yaml", ["self_training.questions=offline-eval", "eval.questions=offline-eval"],
     "eval.questions=offline-eval is the training set itself"),
])
def test_a_grid_whose_training_questions_are_among_its_eval_questions_is_refused_unless_meant(config, overrides, leak):
    """A grid's or the rounds' bootstrap set equal to the eval set (or containing it: react-dev500
    is drawn from dev) trained and scored the students on the same questions without a word."""
    proc = run_pipeline("run", "--config", config, *overrides, "--print-config")
    refused(proc, r"^error: eval: .*: " + leak + APART)
    meant = run_pipeline("run", "--config", config, *overrides, "allow_question_overlap=true", "--print-config")
    assert meant.returncode == 0, meant.stderr[-2000:]


def test_a_grpo_held_out_set_equal_to_its_training_set_is_refused_unless_meant():
    args = ["grpo", "--config", "configs/grpo/smollm2-135m.yaml", "student=smollm2", "heldout.every=5",
            "heldout.questions=offline-bootstrap", "--dry-run"]
    refused(run_pipeline(*args), r"^error: heldout.questions=offline-bootstrap is the training set itself" + APART)
    meant = run_pipeline(*args, "allow_question_overlap=true")
    assert meant.returncode == 0, meant.stderr[-2000:]


def test_a_task_run_on_another_tasks_index_is_refused(tmp_path, index):
    """FEVER claims on the HotpotQA index ran to the end with a 13% search hit rate."""
    out = tmp_path / "gen"
    proc = run_pipeline("generate", "task=fever", "oracle=exact", "limit=100", "methods=[react]",
                        f"wiki.index={index}", f"out_dir={out}")
    refused(proc, rf"wiki.index {re.escape(str(index))} lacks the pages of 86 of the first 98 FEVER questions of "
                  r"offline-bootstrap: is it another task's Wikipedia\? .*wiki.backend=live$")
    assert not out.exists()


def test_a_question_set_some_of_whose_pages_the_index_lacks_is_said_once(tmp_path, index):
    proc = run_pipeline("generate", "oracle=exact", "questions=dev", "limit=100", "methods=[standard]",
                        f"wiki.index={index}", f"out_dir={tmp_path / 'gen'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: wiki.index")]
    assert warnings == [f"warning: wiki.index {index} lacks the pages of 4 of the first 100 questions of dev: their "
                        "episodes cannot find their evidence (a fuller index, or wiki.backend=live)"]
