"""Self-training rounds (pipeline/rounds.py): rejection sampling in generate (k seeded samples
per question), the rounds' units in `run`'s plan, the rounds report, and a real grid on the
oracle and a tiny model: round 2's teacher is round 1's student, and a SIGKILL of `python -m
pipeline run` between rounds and within a round resumes.

    .venv/bin/python -m pytest tests/test_rounds.py -q -m "not slow"   # without the killed grid
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from episode_testdata import CORPUS, read_records, run_pipeline, without_timing

from pipeline.core.config import build
from pipeline.core.errors import PipelineError
from pipeline.stages.run import RunConfig, Student, plan

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "students" / "tiny.yaml"

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


# ---------------------------------------------------------------- k samples per question


def sampled_generate(out: Path, index: Path, model: Path, **keys):
    from pipeline.stages.generate import GenerateConfig, generate

    layers = {"teacher": {"backend": "transformers", "model": str(model), "dtype": "float32", "name": "tiny"},
              "methods": ["react"], "questions": "offline-bootstrap", "limit": 2, "samples": 3,
              "prompting": {"style": "zero_shot", "temperature": 1.0, "max_new_tokens": 6, "max_steps": 2},
              "wiki": {"index": str(index)}, "out_dir": str(out), **keys}
    return generate(build(GenerateConfig, layers))


def records(path: Path) -> list[dict]:
    return sorted((without_timing(r) for r in read_records(path)), key=lambda r: r["id"])


def test_k_samples_per_question_are_seeded_the_same_in_any_batch_and_on_resume(tmp_path, index, tiny_prompt_model):
    """fp32, so that batching changes no logit: 3 samples of 2 questions at temperature 1."""
    stats = sampled_generate(tmp_path / "a", index, tiny_prompt_model, max_in_flight=6)["react"]
    first = records(tmp_path / "a" / "react.jsonl")
    assert [r["id"] for r in first] == [f"{q}#{j}" for q in sorted({r["question_id"] for r in first}) for j in range(3)]
    assert [r["sample"] for r in first] == [0, 1, 2, 0, 1, 2]
    assert len({r["text"] for r in first}) == 6  # every sample draws its own tokens
    assert (stats["n"], stats["questions"], stats["samples"], stats["solved"]) == (6, 2, 3, 0)
    # one episode at a time: the same draws
    sampled_generate(tmp_path / "b", index, tiny_prompt_model, max_in_flight=1)
    assert records(tmp_path / "b" / "react.jsonl") == first
    # killed after 2 episodes (the file cut there): the resumed run draws the same 4 others
    path = tmp_path / "b" / "react.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))
    sampled_generate(tmp_path / "b", index, tiny_prompt_model, max_in_flight=4)
    assert records(path) == first
    # another seed draws other tokens
    sampled_generate(tmp_path / "c", index, tiny_prompt_model, prompting={
        "style": "zero_shot", "temperature": 1.0, "max_new_tokens": 6, "max_steps": 2, "seed": 1})
    assert [r["text"] for r in records(tmp_path / "c" / "react.jsonl")] != [r["text"] for r in first]


def test_sampling_settings_that_cannot_work_are_refused(tmp_path, index, tiny_prompt_model):
    with pytest.raises(PipelineError, match="greedy decoding writes 3 identical episodes"):
        sampled_generate(tmp_path / "g", index, tiny_prompt_model, prompting={"temperature": 0.0})
    with pytest.raises(PipelineError, match="target_correct draws one per question"):
        sampled_generate(tmp_path / "t", index, tiny_prompt_model, target_correct=2)
    # a folder of one episode per question is not resumed with samples
    sampled_generate(tmp_path / "one", index, tiny_prompt_model, samples=1)
    with pytest.raises(PipelineError, match="different samples"):
        sampled_generate(tmp_path / "one", index, tiny_prompt_model)


def test_questions_solved_for_the_first_time_count_against_the_earlier_runs(tmp_path, index):
    from pipeline.stages.generate import GenerateConfig, generate

    def oracle(out: str, limit: int, earlier: list[str]):
        return generate(build(GenerateConfig, {
            "oracle": "agent", "methods": ["react"], "limit": limit,
            "samples": 2, "wiki": {"index": str(index)}, "out_dir": str(tmp_path / out), "earlier_runs": earlier}))

    first = oracle("r1", 3, [])["react"]
    assert "first_solved" not in first and first["questions"] == 3
    second = oracle("r2", 5, [str(tmp_path / "r1")])["react"]
    assert second["first_solved"] == second["solved"] - first["solved"] and second["earlier_runs"] == 1
    # the agent style words its recovery thoughts by the episode's seed: samples may differ, never ids
    assert len({r["id"] for r in read_records(tmp_path / "r2" / "react.jsonl")}) == 10


# A round's teacher served by a real vLLM server (a LoRA round-1 student, seeded samples the same in
# any batch): tests/test_vllm_server.py, on that module's server.


# ---------------------------------------------------------------- the plan


def rounds_grid(tmp_path: Path, index: Path, **self_training) -> dict:
    return {
        "experiment": "rounds", "out_dir": str(tmp_path / "run"), "formats": ["react"],
        "wiki": {"index": str(index)},
        "generate": {"oracle": "exact", "questions": "offline-bootstrap", "limit": 8},
        "filter": {"tokenizer": "smollm2"},
        "train": {"output_root": str(tmp_path / "ckpt"), "max_steps": 4, "global_batch_size": 4,
                  "accelerate_config": "cpu", "save_steps": 2},
        "eval": {"questions": "offline-eval", "limit": 2, "max_in_flight": 4,
                 "prompting": {"max_new_tokens": 10, "max_steps": 2}},
        "plot": {"reference_points": False},
        "students": [{"name": "tiny", "config": str(TINY), "size_class": "tiny", "params_b": 0.0032}],
        "self_training": {"rounds": 3, "limit": 3, "samples": 2, "temperature": 1.0, **self_training},
    }


def planned(config: dict) -> list:
    cfg = build(RunConfig, config)
    return plan(cfg, [build(Student, s) for s in cfg.students])


def test_the_plan_lists_each_round_as_its_own_units_after_round_one(tmp_path, index):
    units = planned(rounds_grid(tmp_path, index))
    assert [(u.phase, u.title) for u in units] == [
        ("teacher", "generate: the teacher writes trajectories"),
        ("filter", "filter: correct trajectories -> SFT datasets"),
        ("train", "train: tiny on react"), ("eval", "eval: tiny fine-tuned on react"),
        *[("rounds", f"{stage} (round {k}): tiny on react{tail}") for k in (2, 3) for stage, tail in (
            ("generate", f", round {k - 1}'s student as the teacher"),
            ("filter", ": correct trajectories -> SFT dataset"), ("train", ""), ("eval", ""))],
        ("plot", "plot: self-training rounds (EM by round)"), ("plot", "plot: figure 3 and the table")]
    gen2, flt2, ft2, ev2, gen3 = units[4:9]
    first = tmp_path / "ckpt" / "rounds" / "tiny" / "react" / "final"
    assert gen2.config.teacher.model == str(first) and gen2.config.teacher.name == "tiny round 1 (react)"
    assert gen2.config.prompting.style == "zero_shot" and gen2.config.prompting.temperature == 1.0
    assert gen2.config.prompting.max_new_tokens == 10  # it decodes as the student's eval does
    assert (gen2.config.samples, gen2.config.limit) == (2, 3)
    assert gen2.config.earlier_runs == [str(tmp_path / "run" / "generate")]
    assert gen3.config.earlier_runs == [str(tmp_path / "run" / "generate"), str(gen2.config.out_dir)]
    assert gen3.config.teacher.model == str(ft2.config.output_dir / "final")
    assert flt2.config.union_with == [str(tmp_path / "run" / "sft")] and flt2.config.inputs == [str(gen2.config.out_dir)]
    assert ft2.config.output_dir == first.parent.parent / "react-round2" and ft2.config.student == "tiny"
    assert ev2.config.out_dir == tmp_path / "run" / "eval" / "tiny-ft-react-round2"
    previous = planned(rounds_grid(tmp_path, index, init="previous", data="new"))
    assert previous[6].config.student == str(first) and previous[6].config.init == "pretrained"
    assert previous[5].config.union_with == []
    # a student trained in the messages layout acts through tool calls in its evals and as a round's teacher
    from pipeline.stages.eval import EvalConfig
    from pipeline.stages.generate import GenerateConfig

    messages = rounds_grid(tmp_path, index)
    messages["train"]["layout"] = "messages"
    messages["eval"].update(model={"backend": "vllm"}, serve={"port": 0})  # tool calls go to a served model
    acting = [(u.title.split(":")[0], u.config.prompting.interface) for u in planned(messages)
              if isinstance(u.config, GenerateConfig | EvalConfig)]
    assert acting == [("generate", "text"), ("eval", "tools"), *[(f"{stage} (round {k})", "tools")
                                                                 for k in (2, 3) for stage in ("generate", "eval")]]
    messages["grpo"] = {"formats": ["react"]}  # GRPO's rollouts decode the text layout
    with pytest.raises(PipelineError, match="grpo: tiny is trained in the messages layout"):
        planned(messages)


def test_the_shipped_rounds_config_plans_the_500_question_grid_a_grpo_unit_and_two_rounds_of_react():
    from pipeline.core.config import read_yaml

    units = planned(read_yaml(REPO / "configs" / "small-rounds.yaml"))
    titles = [u.title for u in units]
    assert sum(t.startswith("train") for t in titles) == 2 + 2  # Standard and ReAct; rounds 2 and 3 of ReAct
    evals = [u for u in units if u.title.startswith("eval")]
    assert len(evals) == 1 + 2 + 1 + 2 and all(u.config.limit is None for u in evals)  # all 500 questions
    grpo = [u for u in units if u.phase == "grpo"]  # the round-1 ReAct student continued with GRPO (docs/grpo.md)
    assert [(str(u.config.student), u.config.max_steps) for u in grpo] == [
        ("checkpoints/small-rounds/smollm2-135m/react/final", 90)]
    rounds = [u for u in units if u.phase == "rounds" and u.title.startswith("generate")]
    assert [(u.config.limit, u.config.samples, u.config.prompting.temperature) for u in rounds] == [(400, 4, 0.7)] * 2
    assert titles[-2:] == ["plot: self-training rounds (EM by round)", "plot: figure 3 and the table"]


def test_the_shipped_chain_config_continues_the_round_3_student_with_grpo_after_round_3():
    """configs/small-chain.yaml: round 1's ReAct student, rounds 2 and 3, then GRPO of round 3's
    student and its eval, in the rounds phase; no prompted cell, no Standard, no round-1 GRPO; the
    GRPO eval is plotted as a GRPO row, the rounds' evals as rounds. Its round-1..3 settings are
    small-rounds' (the same students, so its figures compare with docs/rounds.md's)."""
    from pipeline.core.config import read_yaml

    units = planned(read_yaml(REPO / "configs" / "small-chain.yaml"))
    assert [(u.phase, u.title) for u in units][-6:] == [
        ("rounds", "train (round 3): smollm2-135m on react"), ("rounds", "eval (round 3): smollm2-135m on react"),
        ("rounds", "grpo: smollm2-135m from its round-3 react student"),
        ("rounds", "eval: smollm2-135m after GRPO on react (from round 3)"),
        ("plot", "plot: self-training rounds (EM by round)"), ("plot", "plot: figure 3 and the table")]
    assert not [u for u in units if u.phase == "grpo" or "prompted" in u.title or "standard" in u.title]
    ft3, ev3, gr, ev = (u.config for u in units[-6:-2])
    assert gr.student == str(ft3.output_dir / "final") and gr.student_name == "smollm2-135m-round3-grpo"
    assert (gr.max_steps, gr.group_size, gr.questions_per_step, gr.experiment) == (80, 8, 2, "small-chain")
    assert str(ev.finetuned) == str(gr.output_dir / "final") and ev.limit is None
    plot = units[-1].config
    assert str(ev.out_dir / "summary.json") in plot.summaries and str(ev3.out_dir / "summary.json") in plot.rounds
    assert str(ev.out_dir / "summary.json") not in plot.rounds
    rounds_grid_units = planned(read_yaml(REPO / "configs" / "small-rounds.yaml"))
    same = {u.title: u.config for u in rounds_grid_units}
    for unit in units[:-4]:  # the chain's rounds are small-rounds' own, in their own folders
        if unit.title in same and hasattr(unit.config, "max_steps"):
            assert unit.config.max_steps == same[unit.title].max_steps, unit.title


@pytest.mark.parametrize("grpo, message", [
    ({"formats": ["react"], "from_round": 4}, r"grpo.from_round: 4 is past the last self-training round \(self_training.rounds: 3\)"),
    ({"formats": ["react"], "from_round": 0}, "grpo.from_round"),
])
def test_a_grpo_from_a_round_the_grid_does_not_run_is_refused(tmp_path, index, grpo, message):
    with pytest.raises(PipelineError, match=message):
        planned({**rounds_grid(tmp_path, index), "grpo": grpo})


def test_a_grpo_from_a_round_of_a_format_that_does_not_self_train_is_refused(tmp_path, index):
    grid = {**rounds_grid(tmp_path, index, formats=["react"]), "formats": ["act", "react"]}
    grid["grpo"] = {"formats": ["act", "react"], "from_round": 2}
    with pytest.raises(PipelineError, match="grpo.from_round: 2: tiny on act does not self-train"):
        planned(grid)
    grid["grpo"]["formats"] = ["react"]
    titles = [u.title for u in planned(grid)]
    assert titles.index("grpo: tiny from its round-2 react student") == titles.index("eval (round 2): tiny on react") + 1


def test_a_rounds_eval_and_the_next_rounds_generate_share_one_server_and_no_training_between(tmp_path, index):
    grid = rounds_grid(tmp_path, index)
    grid["eval"].update(model={"backend": "vllm"}, serve={"command": ["vllm-stand-in"], "port": 0})
    units = planned(grid)
    by_title = {u.title: u for u in units}
    shared = by_title["eval (round 2): tiny on react"].group
    assert shared is not None and shared.members == [by_title["eval (round 2): tiny on react"],
                                                     by_title["generate (round 3): tiny on react, round 2's student as the teacher"]]
    assert by_title["generate (round 2): tiny on react, round 1's student as the teacher"].group is None  # round 1's eval is in phase eval
    assert by_title["eval (round 3): tiny on react"].group is None
    assert units[8].config.serve is not None and units[8].needs.startswith("shared server")


@pytest.mark.parametrize("keys, message", [
    ({"formats": ["cot"]}, "formats ['cot'] are not among the grid's formats"),
    ({"methods": ["react"]}, "unknown key 'self_training.methods'; it was renamed: use 'self_training.formats'"),
    ({"students": ["big"]}, "students ['big'] are not students trained here"),
    ({"temperature": 0.0}, "would draw 2 identical episodes"),
    ({"rounds": 0}, "'self_training.rounds' must be >= 1, got 0"),
    ({"init": "again"}, "'self_training.init' must be one of"),
    ({"rouds": 2}, "did you mean 'self_training.rounds'"),
])
def test_bad_self_training_sections_fail_at_plan_time(tmp_path, index, keys, message):
    grid = rounds_grid(tmp_path, index)
    grid["self_training"].update(keys)
    with pytest.raises(PipelineError, match=re.escape(message)):
        planned(grid)


def test_a_bad_self_training_section_is_one_line_and_exit_code_2_before_anything_runs(tmp_path, index):
    grid = rounds_grid(tmp_path, index, formats=["cot"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(grid))
    proc = run_pipeline("run", "--config", str(path))
    assert proc.returncode == 2 and proc.stderr.startswith("error: self_training: formats ['cot']"), proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_a_round_whose_teacher_is_not_trained_yet_stops_in_one_line(tmp_path, index):
    """`--only rounds` on a fresh grid: round 2's teacher (round 1's student) has no final/."""
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(rounds_grid(tmp_path, index)))
    proc = run_pipeline("run", "--config", str(path), "--only", "rounds")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "its teacher, round 1's student" in proc.stderr
    assert "is not trained yet; run the phases before `rounds` first" in proc.stderr
    assert not (tmp_path / "run" / "rounds" / "tiny-react" / "round-2" / "generate" / "react.jsonl").exists()


def test_a_round_whose_student_solved_nothing_trains_on_the_earlier_rows_or_stops_with_data_new(tmp_path):
    from test_filter import episode, generate_folder

    from pipeline.rounds import Round, SelfTrainingConfig, check_round_data, filter_layer
    from pipeline.stages.filter import FilterConfig, run_filter

    first = generate_folder(tmp_path / "gen1", {"react": [episode("a"), episode("b")]})
    run_filter(FilterConfig(inputs=[str(first)], out_dir=str(tmp_path / "sft1")))
    before = Round(1, "tiny", "react", first, tmp_path / "sft1", tmp_path / "ckpt" / "react" / "final", tmp_path / "e1")
    generate_folder(tmp_path / "gen2", {"react": [episode("c", em=0.0), episode("d", finished=False)]})
    for data in ("union", "new"):
        st = SelfTrainingConfig(rounds=2, data=data)
        r = Round(2, "tiny", "react", tmp_path / "gen2", tmp_path / f"sft2-{data}", tmp_path / "f2", tmp_path / "e2")
        stats = run_filter(FilterConfig(**filter_layer(st, {}, before, r)), allow_empty=True)
        assert len(read_records(r.dataset_dir / "react" / "failed.jsonl")) == 2
        if data == "union":
            assert check_round_data(stats, r, st)["react"]["union"] == {
                "datasets": [str(tmp_path / "sft1")], "rows_from_them": 2, "new_rows": 0}
        else:
            assert not (r.dataset_dir / "react" / "train.jsonl").exists()
            with pytest.raises(PipelineError, match="the teacher solved none of the bootstrap questions"):
                check_round_data(stats, r, st)


def test_a_lora_student_cannot_continue_from_the_previous_round(tmp_path, index):
    grid = rounds_grid(tmp_path, index, init="previous")
    grid["train"]["finetuning"] = "lora"
    grid["train"]["init"] = "pretrained"
    with pytest.raises(PipelineError, match="a lora student trains from its base each round"):
        planned(grid)


def test_help_lists_the_self_training_keys():
    proc = run_pipeline("run", "--help")
    assert proc.returncode == 0
    for key in ("self_training.rounds", "self_training.samples", "self_training.init", "self_training.data", "rounds "):
        assert key in proc.stdout, key


def served_rounds_grid(tmp_path: Path, index: Path, questions: Path, serve: dict) -> Path:
    """Three rounds of a LoRA student of SmolLM2 whose evals are served (`serve:`), round 1's
    teacher the oracle, every question from one file."""
    student = tmp_path / "student.yaml"
    student.write_text(yaml.safe_dump({"student": "smollm2", "size_class": "135m", "finetuning": "lora",
                                       "lora": {"r": 64, "alpha": 64}, "output_root": str(tmp_path / "ckpt")}))
    grid = {"experiment": "served", "out_dir": str(tmp_path / "run"), "formats": ["react"], "wiki": {"index": str(index)},
            "generate": {"oracle": "exact", "questions": str(questions)},
            "filter": {"tokenizer": "smollm2"},
            "eval": {"questions": str(questions), "max_in_flight": 2, "model": {"backend": "vllm"}, "serve": serve,
                     "prompting": {"max_new_tokens": 24, "max_steps": 2}},
            "plot": {"reference_points": False},
            "students": [{"name": "tiny", "config": str(student), "size_class": "135m", "params_b": 0.135}],
            "self_training": {"rounds": 3, "samples": 2, "temperature": 0.7},
            "allow_question_overlap": True}  # one file for every question: about serving, not scores
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def test_served_rounds_generate_through_a_server_and_share_one_with_the_round_befores_eval(
        tmp_path, index, smollm2_dir):
    """Against tests/standin_vllm_serve.py (a labelled stand-in that answers with the gold
    trajectory and loads no model; the students' trainings are marked done): round 2's teacher
    gets its own server, round 2's eval and round 3's teacher share one, round 3's eval its own."""
    from episode_testdata import write_questions
    from test_shared_server import STANDIN, server_events
    from vllm_testdata import TAG_VAR, mark_trained, new_tag, wait_until_gone

    from pipeline.tasks.hotpotqa.questions import load_question_set

    questions = write_questions(tmp_path / "q.jsonl", load_question_set("offline-bootstrap", limit=2))
    tag = new_tag()
    serve = {"command": [sys.executable, str(STANDIN)], "port": 0, "startup_timeout_s": 60, "stop_grace_s": 5,
             "env": {TAG_VAR: tag}, "extra_args": ["--standin-questions", str(questions),
                                                   "--standin-record", str(tmp_path / "server.jsonl")]}
    grid = served_rounds_grid(tmp_path, index, questions, serve)
    assert run_pipeline("run", "--config", str(grid), "--until", "filter", timeout=300).returncode == 0
    mark_trained(grid, phases=("train", "rounds"))
    proc = run_pipeline("run", "--config", str(grid), "--only", "rounds", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("[serve] starting:") == 3, proc.stdout[-4000:]
    assert proc.stdout.count("[serve] using the shared server") == 2  # round 2's eval, round 3's generate
    assert wait_until_gone(tag, 10) == []
    asked = {e["model"] for e in server_events(tmp_path) if "model" in e}
    assert asked == {"student-lora", "tiny-ft-react-round2"}
    round3 = tmp_path / "run" / "rounds" / "tiny-react" / "round-3"
    manifest = json.loads((round3 / "generate" / "manifest.json").read_text())
    assert manifest["teacher"] == "tiny round 2 (react)" and manifest["config"]["teacher"]["adapter"].endswith("react-round2/final")
    assert manifest["stats"]["react"]["solved"] == 2 and manifest["stats"]["react"]["first_solved"] == 0
    assert json.loads((round3 / "sft" / "react" / "stats.json").read_text())["union"]["new_rows"] == 0  # the same gold text


# ---------------------------------------------------------------- the report


def test_the_rounds_report_gives_em_by_round_with_intervals_and_dashes_for_rounds_not_run(tmp_path):
    from pipeline.core.storage import atomic_write_json, write_manifest
    from pipeline.report.rounds import RoundsReport, write_rounds_report

    def summary(folder: Path, em: float, n: int, mode: str = "finetune") -> str:
        folder.mkdir(parents=True)
        atomic_write_json(folder / "summary.json", [{"model": "m", "mode": mode, "method": "react", "em": em, "n": n}])
        write_manifest(folder / "manifest.json", stage="eval", config={}, complete=True)
        return str(folder / "summary.json")

    def generation(folder: Path, teacher: str, **stats) -> str:
        folder.mkdir(parents=True)
        write_manifest(folder / "manifest.json", stage="generate", config={}, complete=True, teacher=teacher, stats={"react": stats})
        return str(folder)

    def dataset(folder: Path, **stats) -> str:
        (folder / "react").mkdir(parents=True)
        atomic_write_json(folder / "react" / "stats.json", stats)
        return str(folder / "react")

    rounds = [{"round": 1, "generate": generation(tmp_path / "g1", "oracle", n=100, questions=100, samples=1, solved=90),
               "dataset": dataset(tmp_path / "d1", kept=50, failed={"incorrect": 10}), "summary": summary(tmp_path / "e1", 0.05, 100)},
              {"round": 2, "generate": generation(tmp_path / "g2", "tiny round 1 (react)", n=40, questions=10, samples=4,
                                                  solved=6, first_solved=2),
               "dataset": dataset(tmp_path / "d2", kept=58, failed={"incorrect": 30, "unfinished": 2},
                                  union={"rows_from_them": 50, "new_rows": 8}),
               "summary": summary(tmp_path / "e2", 0.15, 100)},
              {"round": 3, "generate": str(tmp_path / "g3"), "dataset": str(tmp_path / "d3"),
               "summary": str(tmp_path / "e3" / "summary.json")}]
    line = {"student": "tiny", "format": "react", "prompted": summary(tmp_path / "p", 0.02, 100, "prompt"), "rounds": rounds}
    paths = write_rounds_report(RoundsReport(str(tmp_path / "plot"), [line]))
    table = paths["rounds_md"].read_text()
    assert "| prompted | – | – | – | – | – | – | 2.0 [0.6, 7.0] (100) | – | – |" in table
    assert "| 1 | oracle | 100 x 1 | 90 | 90 | incorrect 10 | 50 (50) | 5.0 [2.2, 11.2] (100) | – | – |" in table
    # 15 of 100 against 5 of 100: Newcombe's interval for the +10 points excludes 0
    assert ("| 2 | tiny round 1 (react) | 10 x 4 | 6 | 2 | unfinished 2, incorrect 30 | 58 (8) | "
            "15.0 [9.3, 23.3] (100) | +10.0 [+1.6, +18.8] | +10.0 [+1.6, +18.8] |") in table
    assert "| 3 | – | – | – | – | – | – | – | – | – |" in table
    csv_rows = paths["rounds_csv"].read_text().splitlines()
    assert csv_rows[2].startswith("tiny,react,2,tiny round 1 (react),10,4,40,6,2,0,2,30,0,58,8,100,15.0,9.3")
    assert paths["rounds_png"].stat().st_size > 0 and paths["rounds_svg"].stat().st_size > 0


# ---------------------------------------------------------------- a real grid, killed and resumed


def kill_tree(proc: subprocess.Popen) -> None:
    from test_run import kill_tree as kill

    kill(proc)


def wait_for(proc: subprocess.Popen, ready, what: str, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"run ended before {what}: " + log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.02)


@pytest.mark.slow
def test_rounds_on_the_oracle_and_a_tiny_model_survive_kills_between_and_within_rounds(tmp_path, index, smollm2_dir):
    from pipeline.core.storage import is_done
    from pipeline.train.checkpoints import latest_complete_checkpoint
    from pipeline.train.checks import checkpoint_step

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(rounds_grid(tmp_path, index, rounds=2)))
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt" / "rounds" / "tiny"
    round2 = run_dir / "rounds" / "tiny-react" / "round-2"
    command = [sys.executable, "-m", "pipeline", "run", "--config", str(grid)]

    def start(log: Path) -> subprocess.Popen:
        return subprocess.Popen(command, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    # 1. SIGKILL between rounds: round 1 evaluated, round 2 not generated yet
    proc = start(tmp_path / "first.log")
    wait_for(proc, lambda: is_done(run_dir / "eval" / "tiny-ft-react" / "manifest.json"), "round 1's eval",
             tmp_path / "first.log")
    kill_tree(proc)
    assert not is_done(round2 / "generate" / "manifest.json")

    # 2. SIGKILL within round 2: its training has a checkpoint, no final model
    proc = start(tmp_path / "second.log")
    wait_for(proc, lambda: latest_complete_checkpoint(ckpt / "react-round2") is not None, "round 2's checkpoint",
             tmp_path / "second.log")
    kill_tree(proc)
    resume_from = latest_complete_checkpoint(ckpt / "react-round2")
    assert 0 < checkpoint_step(resume_from) < 4 and not (ckpt / "react-round2" / "final").exists()
    second = (tmp_path / "second.log").read_text()
    for unit in (run_dir / "generate", ckpt / "react" / "final", run_dir / "eval" / "tiny-ft-react"):
        assert f"[run] skip: {unit} is complete" in second
    generated = read_records(round2 / "generate" / "react.jsonl")
    dataset = (round2 / "sft" / "react" / "train.jsonl").read_bytes()

    # 3. the rest runs: round 2's training resumes from that checkpoint; what was written stays
    done = run_pipeline("run", "--config", str(grid), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"[run] skip: {round2 / 'generate'} is complete" in done.stdout and "react: up to date" in done.stdout
    assert f"[finetune] resuming from {resume_from}" in done.stdout
    assert done.stdout.split("train (round 2): tiny on react")[-1].count("{'loss': ") == 4 - checkpoint_step(resume_from)
    assert read_records(round2 / "generate" / "react.jsonl") == generated
    assert (round2 / "sft" / "react" / "train.jsonl").read_bytes() == dataset

    # round 2's teacher is round 1's student, as its manifest says, and it wrote its own trajectories
    manifest = json.loads((round2 / "generate" / "manifest.json").read_text())
    assert manifest["teacher"] == "tiny round 1 (react)" and manifest["complete"]
    assert manifest["config"]["teacher"]["model"] == str(ckpt / "react" / "final")
    assert manifest["config"]["earlier_runs"] == [str(run_dir / "generate")]
    stats = manifest["stats"]["react"]
    assert (stats["n"], stats["questions"], stats["samples"]) == (6, 3, 2) and "first_solved" in stats
    oracle = {r["id"]: r["text"] for r in read_records(run_dir / "generate" / "react.jsonl")}
    assert len({r["id"] for r in generated}) == 6 and all(r["teacher"] == "tiny round 1 (react)" for r in generated)
    assert all(r["text"] != oracle[r["question_id"]] for r in generated)
    # round 2's student trained on its own dataset folder: round 1's rows and what round 2 added
    final2 = json.loads((ckpt / "react-round2" / "final" / "manifest.json").read_text())
    assert final2["complete"] and str(round2 / "sft") in json.dumps(final2)
    union = json.loads((round2 / "sft" / "react" / "stats.json").read_text())["union"]
    assert union["rows_from_them"] == len(read_records(run_dir / "sft" / "react" / "train.jsonl"))
    failed = read_records(round2 / "sft" / "react" / "failed.jsonl")
    assert len(failed) + union["new_rows"] == 6 and {r["why"] for r in failed} <= {"unfinished", "incorrect"}
    table = (run_dir / "plot" / "rounds.md").read_text()
    assert "| 2 | tiny round 1 (react) | 3 x 2 |" in table
    assert (run_dir / "plot" / "rounds.png").stat().st_size > 0 and (run_dir / "plot" / "figure3.png").exists()

    # 4. once more: every unit skipped
    again = run_pipeline("run", "--config", str(grid), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("[run] skip:") == 6  # generate, train and eval of each round
