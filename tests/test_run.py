"""The `run` orchestrator: the shipped grids plan cleanly, a bad section fails before any work,
and a tiny grid runs end to end, survives a kill, and finishes at once when run again."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.core.config import build, read_yaml
from pipeline.stages.run import RunConfig, Student, plan

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["demo.yaml", "paper.yaml"])
def test_shipped_experiment_configs_plan_every_unit(name):
    cfg = build(RunConfig, read_yaml(REPO / "configs" / name))
    students = [build(Student, s) for s in cfg.students]
    titles = [u.title for u in plan(cfg, students)]
    trained = sum(s.finetune for s in students)
    prompted = sum(bool(s.prompt_model) for s in students)
    # the teacher's own prompted eval (if any) runs beside generate, before filter (tests/test_run_phases.py)
    assert titles[0].startswith("generate") and titles[-1].startswith("plot")
    assert [t for t in titles if not t.startswith("eval")][1].startswith("filter")
    assert sum(t.startswith("train") for t in titles) == 4 * trained
    assert sum(t.startswith("eval") for t in titles) == 4 * trained + prompted


def test_the_old_grid_key_methods_names_formats(tmp_path):
    """A grid's `methods` (and its filter section's) meant the trajectory formats: renamed `formats`."""
    from pipeline.core.config import load_config
    from pipeline.core.errors import PipelineError

    data = read_yaml(REPO / "configs" / "demo.yaml")
    data["methods"] = data.pop("formats")
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PipelineError, match=r"unknown key 'methods'; it was renamed: use 'formats'"):
        load_config(RunConfig, path)
    data["formats"] = data.pop("methods")
    data["filter"]["methods"] = ["react"]
    cfg = build(RunConfig, data)
    with pytest.raises(PipelineError, match=r"filter: unknown key 'methods'; it was renamed: use 'formats'"):
        plan(cfg, [build(Student, s) for s in cfg.students])


def test_the_old_student_key_checkpoint_names_finetuned_and_old_eval_manifests_still_count(tmp_path):
    """A student's (and eval's) model to evaluate was `checkpoint`: renamed `finetuned`. An eval unit
    whose manifest was written with the old key is still done (pipeline.core.config upgrade_keys)."""
    from pipeline.core.config import to_dict
    from pipeline.core.errors import PipelineError
    from pipeline.core.storage import write_manifest
    from pipeline.stages.grid.children import unit_done
    from pipeline.stages.grid.unit_configs import finetuned_eval_config

    with pytest.raises(PipelineError, match=r"unknown key 'checkpoint'; it was renamed: use 'finetuned'"):
        build(Student, {"name": "agent", "checkpoint": "forestai/fireact_llama_2_7b_lora"})
    cfg = build(RunConfig, {"out_dir": str(tmp_path / "run"), "formats": ["react"]})
    ev = finetuned_eval_config(cfg, build(Student, {"name": "agent", "finetuned": "forestai/fireact_llama_2_7b_lora"}))
    assert str(ev.finetuned) == "forestai/fireact_llama_2_7b_lora" and ev.out_dir.name == "agent-checkpoint"
    new = to_dict(ev)
    old = {("checkpoint" if k == "finetuned" else k): v for k, v in new.items()}
    assert "checkpoint" in old and "finetuned" not in old
    for config, done in ((new, True), (old, True), (dict(old, checkpoint="another/agent"), False)):
        write_manifest(ev.out_dir / "manifest.json", stage="eval", config=config, complete=True)
        assert unit_done(ev) is done, config


def run_pipeline(*args: str, cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True,
                          text=True, **kwargs)


def test_a_typo_in_a_later_section_fails_before_anything_runs(tmp_path):
    data = read_yaml(REPO / "configs" / "demo.yaml")
    data["out_dir"] = str(tmp_path / "run")
    data["eval"]["limt"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = run_pipeline("run", "--config", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "unknown key 'limt'; did you mean 'limit'" in proc.stderr
    assert not (tmp_path / "run").exists()


# The grid's trainings: enough steps that a kill after the first checkpoint lands mid-training.
TRAIN_STEPS, SAVE_EVERY = 4, 2


def tiny_grid(tmp_path: Path, shared_data: Path, base: Path) -> Path:
    config = {
        "experiment": "e2e",
        "out_dir": str(tmp_path / "run"),
        "formats": ["standard", "react"],
        "wiki": {"index": str(tmp_path / "wiki.sqlite"), "corpus": [str(shared_data / "wiki" / "corpus.jsonl")]},
        "generate": {"oracle": "exact", "questions": "offline-bootstrap", "limit": 12},
        "filter": {"tokenizer": "smollm2"},
        "train": {"output_root": str(tmp_path / "ckpt"), "max_steps": TRAIN_STEPS, "global_batch_size": 4,
                  "accelerate_config": "cpu", "save_steps": SAVE_EVERY},
        "eval": {"questions": "offline-eval", "limit": 3, "max_in_flight": 3,
                 "prompting": {"max_new_tokens": 8, "max_steps": 2}},
        "plot": {"reference_points": False},
        "students": [{"name": "tiny", "config": str(REPO / "configs" / "students" / "tiny.yaml"),
                      "size_class": "tiny", "params_b": 0.0032,
                      "prompt_model": {"backend": "transformers", "model": str(base), "name": "tiny-base"}}],
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def outputs(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*.jsonl"))}


def records_without_timing(run_dir: Path) -> dict[str, list[dict]]:
    """Every record file under the run folder, parsed, without the timing fields."""
    from episode_testdata import read_records, without_timing

    return {name: [without_timing(r) for r in read_records(run_dir / name)] for name in outputs(run_dir)}


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `run` and everything under it. `train` starts `accelerate launch` in its own
    session (so that Ctrl-C reaches the whole launch), so killing run's process group alone
    would leave the training going on in the background."""
    import psutil

    root = psutil.Process(proc.pid)
    tree = [root, *root.children(recursive=True)]
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, alive
    proc.wait()


@pytest.mark.slow
def test_a_tiny_grid_killed_mid_training_resumes_from_its_checkpoint_and_then_skips_everything(
        tmp_path, shared_data, tiny_prompt_model):
    from pipeline.train.checkpoints import latest_complete_checkpoint
    from pipeline.train.checks import checkpoint_step

    grid = tiny_grid(tmp_path, shared_data, tiny_prompt_model)
    run_dir = tmp_path / "run"
    first_training = tmp_path / "ckpt" / "e2e" / "tiny" / "standard"

    # 1. Kill the whole process tree as soon as the first training has a complete checkpoint on disk.
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--config", str(grid)], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while proc.poll() is None and latest_complete_checkpoint(first_training) is None:
        assert time.monotonic() < deadline, "no checkpoint within 600 s"
        time.sleep(0.02)
    assert proc.poll() is None, "run ended before any checkpoint: " + (tmp_path / "first.log").read_text()[-3000:]
    kill_tree(proc)
    # Proof that the kill landed mid-training: a complete checkpoint short of the last step, no final model.
    resume_from = latest_complete_checkpoint(first_training)
    assert 0 < checkpoint_step(resume_from) < TRAIN_STEPS and not (first_training / "final").exists()
    assert not (run_dir / "plot").exists()
    finished_before_kill = records_without_timing(run_dir)  # generate, filter (every eval runs after training)
    assert {"generate/standard.jsonl", "generate/react.jsonl", "sft/standard/train.jsonl"} <= set(finished_before_kill)
    assert not (run_dir / "eval").exists()

    # 2. Re-run: the finished units are skipped and their records are unchanged; the training
    # resumes from that checkpoint (only the steps after it are trained); figure and table written.
    done = run_pipeline("run", "--config", str(grid), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"[run] skip: {run_dir / 'generate'} is complete" in done.stdout
    assert "standard: up to date" in done.stdout and "react: up to date" in done.stdout  # filter
    # split at the unit's own header ("[run] === [i/n] train: ..."), not at its line in the plan
    first, second = done.stdout.split("] train: tiny on react")[0], done.stdout.split("] train: tiny on react")[1]
    assert f"[finetune] resuming from {resume_from}" in first
    # the trainer logs every step's loss: after the resume only the steps past the checkpoint ran
    assert first.count("{'loss': ") == TRAIN_STEPS - checkpoint_step(resume_from)
    assert "[finetune] starting from step 0" in second  # the second training had not started
    final = json.loads((first_training / "final" / "manifest.json").read_text())
    assert final["steps"] == TRAIN_STEPS
    after = records_without_timing(run_dir)
    assert {name: after[name] for name in finished_before_kill} == finished_before_kill
    for name in ("figure3.png", "figure3.svg", "results.csv", "results.md", "orderings.md"):
        assert (run_dir / "plot" / name).stat().st_size > 0
    assert (tmp_path / "ckpt" / "e2e" / "tiny" / "react" / "final" / "manifest.json").exists()
    card = (tmp_path / "ckpt" / "e2e" / "tiny" / "react" / "final" / "README.md").read_text()
    react = json.loads((run_dir / "eval" / "tiny-ft-react" / "summary.json").read_text())[0]
    assert f"| react | offline-eval | 3 | {100 * react['em']:.1f} | {100 * react['f1']:.1f} |" in card
    summaries = sorted(p.parent.name for p in (run_dir / "eval").glob("*/summary.json"))
    assert summaries == ["tiny-ft-react", "tiny-ft-standard", "tiny-prompt"]
    before = outputs(run_dir)

    # 3. run again: every unit is skipped, no record changes
    again = run_pipeline("run", "--config", str(grid), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("[run] skip:") == 6  # generate, 1 prompted eval, 2 trainings, 2 evals
    assert outputs(run_dir) == before

    # 3b. Keys that say what a training keeps and logs are not what it learned: changed, nothing is
    # retrained, and `keep_checkpoints: false` removes the checkpoints the finished runs kept.
    assert list(first_training.glob("checkpoint-*"))
    tidy = run_pipeline("run", "--config", str(grid), "train.keep_checkpoints=false", "train.save_total_limit=1",
                        "train.logging_steps=2", "train.report_to=none", timeout=600)
    assert tidy.returncode == 0, tidy.stderr[-3000:]
    assert tidy.stdout.count("[run] skip:") == 6 and outputs(run_dir) == before
    assert f"checkpoint folder(s) of {first_training}," in tidy.stdout
    assert not list((tmp_path / "ckpt").rglob("checkpoint-*"))

    # 4. In another precision (forced here; `auto` on other hardware is the same), nothing runs: one
    # line names the first unit whose results hold the old precision and how to go on.
    was = final["precision"]
    other = "fp32" if was == "bf16" else "bf16"
    changed = run_pipeline("run", "--config", str(grid), timeout=600,
                           env={**os.environ, "REACT_PIPELINE_PRECISION": other})
    assert changed.returncode == 2, changed.stderr[-3000:]
    line = changed.stderr.strip().splitlines()[-1]
    assert [x for x in changed.stderr.splitlines() if x.startswith("error: ")] == [line]
    # the 2 trainings, the prompted eval and the 2 fine-tuned evals
    assert line.startswith(f"error: {first_training / 'final'} holds results computed in {was}, this run would "
                           f"compute it in {other} and 4 more unit(s); run mixes no precisions"), line
    assert f"REACT_PIPELINE_PRECISION={was}, or" in line
    assert "[run] ===" not in changed.stdout  # before the first unit
    assert outputs(run_dir) == before


def test_a_finished_training_is_this_configs_whatever_it_kept_and_logged_but_not_whatever_it_learned(tmp_path):
    """The rule `run` skips a training unit by (and the grpo unit), on a real manifest."""
    from pipeline.core.storage import write_manifest
    from pipeline.stages.grid.children import trained_then

    final, checkpoint = tmp_path / "final", tmp_path / "checkpoint-20"
    final.mkdir()
    checkpoint.mkdir()
    config = {"learning_rate": 1e-4, "max_steps": 20, "save_steps": 5, "save_total_limit": 3,
              "keep_checkpoints": True, "logging_steps": 1, "report_to": "none"}
    write_manifest(final / "manifest.json", stage="train", config=config, complete=True, precision="bf16")
    kept_and_logged = {"save_steps": 2, "save_total_limit": 1, "logging_steps": 10, "report_to": "tensorboard"}
    assert trained_then(final, {**config, **kept_and_logged}, precision="bf16") and checkpoint.is_dir()
    assert not trained_then(final, {**config, "learning_rate": 2e-4}, precision="bf16")
    assert not trained_then(final, {**config, "max_steps": 40}, precision="bf16")
    assert not trained_then(final, config, precision="fp32")
    assert checkpoint.is_dir()  # a training that is redone resumes from its checkpoints
    assert trained_then(final, {**config, "keep_checkpoints": False}, precision="bf16")
    assert not checkpoint.exists() and final.is_dir()


GRPO_STEPS = 2


@pytest.mark.slow
def test_a_tiny_grid_with_a_grpo_section_trains_evaluates_and_plots_its_grpo_student(tmp_path, shared_data, smollm2_dir):
    """The grpo phase for real, lean: the oracle STAND-IN teacher (gold facts, labelled so in the
    plan) writes ReAct trajectories, the tiny student trains 4 steps, GRPO continues it for 2 steps
    of 1 question x 2 rollouts under a real `accelerate launch` (one process), and the GRPO student
    is evaluated (its own process) and plotted beside the fine-tuned one; run again, every unit is
    skipped, the grpo unit by its final/ manifest."""
    grid = read_yaml(tiny_grid(tmp_path, shared_data, smollm2_dir))
    grid["formats"] = ["react"]
    grid["students"][0].pop("prompt_model")
    grid["grpo"] = {"formats": ["react"], "settings": {
        "questions": "offline-bootstrap", "limit": 2, "questions_per_step": 1, "group_size": 2,
        "max_steps": GRPO_STEPS, "save_steps": 1, "accelerate_config": "cpu", "rollout": {"max_batch_size": 2},
        "prompting": {"max_new_tokens": 8, "max_steps": 2}}}
    path = tmp_path / "grid-grpo.yaml"
    path.write_text(yaml.safe_dump(grid))
    run_dir, grpo_dir = tmp_path / "run", tmp_path / "ckpt" / "e2e" / "tiny-grpo" / "react"

    done = run_pipeline("run", "--config", str(path), timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    plan_lines = [line for line in done.stdout.splitlines() if line.startswith("[run]  ")]
    assert "no model: the oracle stand-in teacher (gold facts)" in "\n".join(plan_lines)
    assert any(line.endswith("grpo     grpo: tiny from its react fine-tune") for line in plan_lines), plan_lines
    assert done.stdout.index("] grpo: tiny from its react fine-tune") > done.stdout.index("] train: tiny on react")
    manifest = json.loads((grpo_dir / "final" / "manifest.json").read_text())
    assert (manifest["stage"], manifest["steps"], manifest["student"]) == ("grpo", GRPO_STEPS, "tiny-grpo")
    assert manifest["start"]["checkpoint"] == str(tmp_path / "ckpt" / "e2e" / "tiny" / "react" / "final")
    [row] = json.loads((run_dir / "eval" / "tiny-grpo-react" / "summary.json").read_text())
    assert (row["model"], row["training"], row["mode"], row["method"], row["n"]) == \
        ("tiny-grpo (GRPO)", "grpo", "finetune", "react", 3)
    md = (run_dir / "plot" / "results.md").read_text()
    assert "| method | tiny (fine-tuned) (tiny) | tiny-grpo (GRPO) (tiny) |" in md
    table = list(csv.DictReader((run_dir / "plot" / "results.csv").open()))
    assert [(t["model"], t["training"]) for t in table] == [("tiny (fine-tuned)", ""), ("tiny-grpo (GRPO)", "grpo")]
    assert "fine-tuned, then GRPO in the environment" in (run_dir / "plot" / "figure3.svg").read_text()  # its legend entry
    assert f"| react | offline-eval | 3 | {100 * row['em']:.1f} |" in (grpo_dir / "final" / "README.md").read_text()
    before = outputs(run_dir)

    again = run_pipeline("run", "--config", str(path), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"[run] skip: {grpo_dir / 'final'} is complete" in again.stdout
    assert again.stdout.count("[run] skip:") == 5  # generate, training, grpo, 2 evals
    assert outputs(run_dir) == before


def test_compare_oracle_matches_the_stand_ins_rows_to_the_teachers_questions_and_row_counts(
        tmp_path, index, tiny_prompt_model):
    """The plan of a grid with a model teacher and `compare_oracle: agent`, its two filter units run
    on real episodes of the real index: the teacher's datasets get equal rows per format, and the
    stand-in's keep, per format, its trajectories of exactly those questions the teacher's rows
    answer and it solved, as many as the teacher's rows where it solved them all. The teacher's
    episodes here are a STAND-IN's too (the oracle in its exact style, 2 samples a question, written
    into the teacher's generate folder): the tiny random teacher of the plan would solve nothing."""
    from dataclasses import replace

    from pipeline.core.storage import read_jsonl
    from pipeline.llm.config import LLMConfig
    from pipeline.sampling import question_id, question_of_row
    from pipeline.stages.filter import run_filter
    from pipeline.stages.generate import generate

    cfg = build(RunConfig, {
        "experiment": "teachers", "out_dir": str(tmp_path / "run"), "formats": ["standard", "react"],
        "compare_oracle": "agent", "wiki": {"index": str(index)},
        "generate": {"teacher": {"backend": "transformers", "model": str(tiny_prompt_model)}, "limit": 40,
                     "samples": 2, "prompting": {"temperature": 0.7}},
        "filter": {"per_question": 1, "equal_rows": True},
        "train": {"output_root": str(tmp_path / "ckpt"), "max_steps": 2, "global_batch_size": 4,
                  "accelerate_config": "cpu"},
        "eval": {"questions": "offline-eval", "limit": 2},
        "students": [{"name": "tiny", "config": str(REPO / "configs" / "students" / "tiny.yaml"),
                      "size_class": "tiny", "params_b": 0.0032}]})
    units = {u.title: u for u in plan(cfg, [build(Student, s) for s in cfg.students])}
    assert [t for t in units if "stand-in" in t] == [
        "generate: the oracle stand-in (agent) on the same questions",
        "filter: the stand-in's trajectories of the teacher's questions, as many rows -> SFT datasets",
        "train: tiny on standard, the stand-in's data", "train: tiny on react, the stand-in's data",
        "eval: tiny fine-tuned on standard, the stand-in's data", "eval: tiny fine-tuned on react, the stand-in's data"]
    teacher_gen = units["generate: the teacher writes trajectories"].config
    stand_in_gen = units["generate: the oracle stand-in (agent) on the same questions"].config
    assert (stand_in_gen.questions, stand_in_gen.limit, stand_in_gen.wiki) == (teacher_gen.questions, 40, teacher_gen.wiki)
    assert units["train: tiny on react, the stand-in's data"].config.output_dir == tmp_path / "ckpt" / "teachers" / "tiny-oracle-data" / "react"
    generate(replace(teacher_gen, oracle="exact", teacher=LLMConfig()))  # the labelled stand-in for the model teacher
    generate(stand_in_gen)
    teacher = run_filter(units["filter: correct trajectories -> SFT datasets"].config)
    stand_in = run_filter(units["filter: the stand-in's trajectories of the teacher's questions, as many rows -> "
                                "SFT datasets"].config)
    rows = {fmt: s["kept"] for fmt, s in teacher.items()}
    assert len(set(rows.values())) == 1 and min(s["equal_rows"]["kept_before"] for s in teacher.values()) == rows["react"]
    run = tmp_path / "run"
    for fmt in ("standard", "react"):
        theirs = [question_of_row(r) for r in read_jsonl(run / "sft" / fmt / "train.jsonl")]
        ours = [question_of_row(r) for r in read_jsonl(run / "sft-oracle" / fmt / "train.jsonl")]
        solved = {question_id(e) for e in read_jsonl(run / "generate-oracle" / f"{fmt}.jsonl") if e["em"] == 1 and e["finished"]}
        assert len(theirs) == len(set(theirs)) == rows[fmt] and len(ours) == len(set(ours))
        assert set(ours) == set(theirs) & solved  # the same questions, every one the stand-in solved
        assert stand_in[fmt]["dropped"].get("other_question", 0) == len(solved - set(theirs))
        matched = stand_in[fmt]["matched"]
        assert (matched["its_rows"], matched["rows"], matched["questions_unsolved"]) == \
            (rows[fmt], len(ours), len(set(theirs) - solved))
