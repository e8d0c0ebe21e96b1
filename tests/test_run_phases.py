"""`run` in phases (teacher, filter, train, eval, plot): the order of the units, the selectors
--only / --from / --until, the plan that says what each unit needs served where, and each eval
in its own process, on a real small grid (oracle teacher, a prompted student behind the fake
OpenAI-compatible server).

    .venv/bin/python -m pytest tests/test_run_phases.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from episode_testdata import CORPUS, ScriptedTeacher, run_pipeline
from http_servers import FakeOpenAI

from pipeline.core.config import build, read_yaml
from pipeline.core.errors import PipelineError
from pipeline.stages.run import PHASES, RunConfig, Student, plan, selected_phases

REPO = Path(__file__).resolve().parents[1]


def grid_units(name: str = "paper.yaml") -> list:
    cfg = build(RunConfig, read_yaml(REPO / "configs" / name))
    return plan(cfg, [build(Student, s) for s in cfg.students])


def paper_units():
    return grid_units("paper.yaml")


def test_the_paper_grid_runs_the_teacher_first_then_training_then_the_other_evals():
    units = paper_units()
    order = list(PHASES)
    assert [order.index(u.phase) for u in units] == sorted(order.index(u.phase) for u in units)
    teacher = [u.title for u in units if u.phase == "teacher"]
    assert teacher == ["generate: the teacher writes trajectories", "eval: llama-3.1-405b-teacher prompted"]
    assert all(u.title.startswith("train") for u in units if u.phase == "train")
    assert all(u.title.startswith("eval") for u in units if u.phase == "eval")
    assert units[-1].phase == "plot"


@pytest.mark.parametrize("gpus, processes", [(0, 8), (4, 4), (8, 8)])
def test_the_plan_says_which_model_each_unit_needs_served_where(monkeypatch, gpus, processes):
    # the plan counts this node's GPUs: patched, so the test says the same on any machine
    # (0: the accelerate file's own count, 8; otherwise one process per GPU)
    monkeypatch.setattr("pipeline.train.launcher.gpu_count", lambda: gpus)
    needs = {u.title: u.needs for u in paper_units()}
    assert "served at http://127.0.0.1:8000/v1" in needs["generate: the teacher writes trajectories"]
    assert needs["train: llama-3.1-8b on react"] == (f"launches accelerate with {processes} processes "
                                                     f"(deepspeed_zero2; this node has {gpus} GPU(s))")
    served = needs["eval: llama-3.1-70b fine-tuned on react"]
    if not gpus:  # no GPU share to speak of on this node: vLLM's CPU build would serve them
        assert not [need for need in needs.values() if "of each GPU's memory" in need]
        assert "vLLM's CPU build: this node has no GPU" in needs["eval: llama-3.1-8b fine-tuned on react"]
        return
    assert "vllm" in served and "tensor parallel 8" in served  # the 70B's own eval settings
    assert "tensor parallel 1" in needs["eval: llama-3.1-8b fine-tuned on react"]


def test_the_prompted_70b_and_its_lora_students_share_one_server_and_the_full_finetunes_do_not():
    units = paper_units()
    shared = {u.title: u.group for u in units if u.group is not None}
    assert sorted(shared) == ["eval: llama-3.1-70b fine-tuned on act", "eval: llama-3.1-70b fine-tuned on cot",
                              "eval: llama-3.1-70b fine-tuned on react", "eval: llama-3.1-70b fine-tuned on standard",
                              "eval: llama-3.1-70b prompted"]
    assert len({id(g) for g in shared.values()}) == 1  # one server, 4 adapters by name
    assert "shared server #1 for meta-llama/Llama-3.1-70B (units 17, 18, 19, 20, 21; 4 LoRA adapter(s)" in \
        shared["eval: llama-3.1-70b prompted"].describe({id(u): i for i, u in enumerate(units, start=1)})
    full = [u for u in units if u.title.startswith("eval: llama-3.1-8b fine-tuned")]
    assert full and all(u.group is None and u.needs.startswith("starts `") for u in full)


@pytest.mark.parametrize("only, start, until, expected", [
    (None, None, None, list(PHASES)),
    ("teacher", None, None, ["teacher"]),
    ("eval,train", None, None, ["train", "eval"]),
    (None, "filter", None, ["filter", "train", "grpo", "eval", "rounds", "plot"]),
    (None, None, "train", ["teacher", "filter", "train"]),
    (None, "train", "eval", ["train", "grpo", "eval"]),
])
def test_selectors_name_phases(only, start, until, expected):
    assert selected_phases(only, start, until) == expected


@pytest.mark.parametrize("only, start, until, message", [
    ("trian", None, None, "--only trian: not a phase; did you mean 'train'?"),
    ("train", "filter", None, "cannot be combined"),
    (None, "eval", "train", "--from eval comes after --until train"),
    (None, "generate", None, "--from generate: not a phase"),
    # an empty or partly empty phase list selects nothing: refused, never run as the whole grid
    ("", None, None, "--only: names no phase"),
    ("  ", None, None, "--only: names no phase"),
    (",", None, None, "--only: names no phase"),
    ("train,", None, None, "--only: names no phase"),
    ("teacher,,plot", None, None, "--only: names no phase"),
    ("train,plto", None, None, "--only plto: not a phase"),
    (None, "", None, "--from: names no phase"),
    (None, None, "", "--until: names no phase"),
    ("", "", None, "cannot be combined"),
])
def test_bad_selectors_are_refused(only, start, until, message):
    with pytest.raises(PipelineError, match=message):
        selected_phases(only, start, until)


def test_a_lora_student_evaluated_over_http_without_serve_is_refused_at_plan_time():
    cfg = build(RunConfig, read_yaml(REPO / "configs" / "paper.yaml"))
    students = [build(Student, s) for s in cfg.students]
    students[1].eval = {"model": {"backend": "openai"}, "serve": None}  # the 70B LoRA student
    with pytest.raises(PipelineError, match="adapter cannot be evaluated at .* as the base model's name"):
        plan(cfg, students)


def demo_with_grpo(**section) -> tuple[RunConfig, list[Student]]:
    data = read_yaml(REPO / "configs" / "demo.yaml")
    data["grpo"] = section
    cfg = build(RunConfig, data)
    return cfg, [build(Student, s) for s in cfg.students]


def test_a_grpo_section_adds_a_grpo_unit_per_format_after_training_and_an_eval_of_its_result():
    cfg, students = demo_with_grpo(formats=["react"], config=str(REPO / "configs" / "grpo" / "smollm2-135m.yaml"),
                                   settings={"max_steps": 3, "group_size": 4})
    units = plan(cfg, students)
    phases = [u.phase for u in units]
    assert phases.index("grpo") > max(i for i, p in enumerate(phases) if p == "train")
    assert phases.index("grpo") < phases.index("eval")
    [unit] = [u for u in units if u.phase == "grpo"]
    assert unit.title == "grpo: smollm2-135m from its react fine-tune"
    gr = unit.config  # the section's YAML < the grid's wiki < settings < this unit's start and names
    assert gr.student == "checkpoints/demo/smollm2-135m/react/final" and gr.format == "react"
    assert (gr.max_steps, gr.group_size, gr.prompting.temperature) == (3, 4, 0.7)
    assert str(gr.output_dir) == "checkpoints/demo/smollm2-135m-grpo/react" and gr.experiment == "demo"
    assert str(gr.wiki.index) == cfg.wiki["index"]
    assert unit.needs.startswith("launches accelerate with 1 process (cpu;")
    [ev] = [u for u in units if u.title == "eval: smollm2-135m after GRPO on react"]
    assert ev.phase == "eval" and str(ev.config.finetuned) == f"{gr.output_dir}/final"
    assert str(ev.config.out_dir) == "runs/demo/eval/smollm2-135m-grpo-react" and ev.config.methods == ["react"]
    assert ev.config.out_dir / "summary.json" in [Path(s) for s in units[-1].config.summaries]
    assert len(units) == len(grid_units("demo.yaml")) + 2  # nothing else changes


@pytest.mark.parametrize("section, message", [
    ({"formats": ["cot"]}, "grpo.formats: 'cot' must be a format this grid trains .* and an interactive loop"),
    ({"formats": ["react"], "settings": {"group_sise": 4}}, "unknown key 'group_sise'; did you mean 'group_size'"),
    ({"formts": ["react"]}, "unknown key 'grpo.formts'; did you mean 'grpo.formats'"),
])
def test_a_bad_grpo_section_fails_at_plan_time(section, message):
    with pytest.raises(PipelineError, match=message):
        plan(*demo_with_grpo(**section))


def test_without_a_grpo_section_there_is_no_grpo_unit_and_a_stranger_in_its_students_is_refused():
    assert not [u for u in grid_units("demo.yaml") if u.phase == "grpo"]
    with pytest.raises(PipelineError, match=r"grpo.students: \['someone-else'\] are not students trained here"):
        plan(*demo_with_grpo(formats=["react"], students=["someone-else"]))  # it used to drop GRPO silently


def test_a_grpo_unit_whose_final_is_complete_with_its_config_is_skipped(tmp_path, monkeypatch, capsys):
    from pipeline.core.config import to_dict
    from pipeline.core.storage import write_manifest

    cfg, students = demo_with_grpo(formats=["react"], settings={"output_root": str(tmp_path), "max_steps": 2})
    [unit] = [u for u in plan(cfg, students) if u.phase == "grpo"]
    launched = []
    monkeypatch.setattr("pipeline.stages.grid.children.grpo", lambda gr: launched.append(gr) or 0)  # records the launch
    final = unit.config.output_dir / "final"
    write_manifest(final / "manifest.json", stage="grpo", config=dict(to_dict(unit.config), max_steps=1), complete=True)
    unit.action(unit.config)  # another config's final/: launched again (it resumes or redoes)
    assert launched == [unit.config]
    write_manifest(final / "manifest.json", stage="grpo", config=to_dict(unit.config), complete=True)
    unit.action(unit.config)
    assert launched == [unit.config] and f"[run] skip: {final} is complete" in capsys.readouterr().out


def test_a_grpo_final_written_before_a_later_key_is_still_this_configs(tmp_path, monkeypatch, capsys):
    """A GRPO final/ written after `task` and `heldout` existed but before `allow_question_overlap`
    did holds the first two and lacks the third: it is still done (each ADDED_LATER key left out
    only where the manifest lacks it); the same manifest with another held-out setting is not."""
    from pipeline.core.config import to_dict
    from pipeline.core.storage import write_manifest

    cfg, students = demo_with_grpo(formats=["react"], settings={"output_root": str(tmp_path), "max_steps": 2})
    [unit] = [u for u in plan(cfg, students) if u.phase == "grpo"]
    launched = []
    monkeypatch.setattr("pipeline.stages.grid.children.grpo", lambda gr: launched.append(gr) or 0)  # records the launch
    final, then = unit.config.output_dir / "final", to_dict(unit.config)
    del then["allow_question_overlap"]
    assert "task" in then and "heldout" in then
    write_manifest(final / "manifest.json", stage="grpo", config=then, complete=True)
    unit.action(unit.config)
    assert launched == [] and f"[run] skip: {final} is complete" in capsys.readouterr().out
    write_manifest(final / "manifest.json", stage="grpo", complete=True,
                   config=dict(then, heldout=dict(then["heldout"], every=then["heldout"]["every"] + 1)))
    unit.action(unit.config)
    assert launched == [unit.config]


# -- a real small grid, phase by phase ----------------------------------------------------------


@pytest.fixture
def grid(tmp_path, index, smollm2_dir):
    def write(url: str) -> Path:
        config = {
            "experiment": "phases", "out_dir": str(tmp_path / "run"), "formats": ["react"],
            "wiki": {"index": str(index)},
            "generate": {"oracle": "exact", "questions": "offline-bootstrap", "limit": 4},
            "filter": {"tokenizer": "smollm2"},
            "eval": {"questions": "offline-eval", "limit": 2, "max_in_flight": 2},
            "plot": {"reference_points": False},
            "students": [{"name": "big", "finetune": False, "size_class": "70b", "params_b": 70.6,
                          "prompt_model": {"backend": "openai", "model": "big-model", "base_url": url,
                                           "max_retries": 1, "timeout_s": 5}}],
        }
        path = tmp_path / "grid.yaml"
        path.write_text(yaml.safe_dump(config))
        return path
    return write


needs_corpus = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@needs_corpus
def test_a_grid_runs_one_phase_at_a_time_and_each_eval_in_its_own_process(tmp_path, grid):
    from pipeline.tasks.hotpotqa.questions import load_question_set

    run_dir = tmp_path / "run"
    with FakeOpenAI(model="big-model") as server:
        server.replies = ScriptedTeacher(load_question_set("offline-eval", limit=2))
        config = str(grid(f"{server.url}/v1"))

        teacher = run_pipeline("run", "--config", config, "--only", "teacher", timeout=300)
        assert teacher.returncode == 0, teacher.stderr[-3000:]
        assert (run_dir / "generate" / "react.jsonl").is_file()
        generated = json.loads((run_dir / "generate" / "manifest.json").read_text())
        assert generated["argv"][1:3] == ["generate", "--config"]  # a process of its own, as the eval's
        assert not (run_dir / "sft").exists() and not (run_dir / "eval").exists()
        plan_lines = [line for line in teacher.stdout.splitlines() if line.startswith("[run]  ")]
        assert "filter: correct trajectories -> SFT datasets  -- not selected" in "\n".join(plan_lines)
        assert "eval: big prompted  -- not selected" in "\n".join(plan_lines)
        assert "needs big-model served at http://127.0.0.1:" in teacher.stdout
        assert len(server.requests) == 0  # the prompted eval is not the teacher's: not in this phase

        filtered = run_pipeline("run", "--config", config, "--from", "filter", "--until", "filter", timeout=300)
        assert filtered.returncode == 0, filtered.stderr[-3000:]
        assert "=== [2/4] filter:" in filtered.stdout and "=== [1/4]" not in filtered.stdout
        assert (run_dir / "sft").is_dir()

        evaluated = run_pipeline("run", "--config", config, "--only", "eval", timeout=300)
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        manifest = json.loads((run_dir / "eval" / "big-prompt" / "manifest.json").read_text())
        assert manifest["complete"] and manifest["argv"][1:3] == ["eval", "--config"]  # a process of its own
        assert not (run_dir / "plot").exists()

        again = run_pipeline("run", "--config", config, "--only", "eval", timeout=300)
        assert again.returncode == 0 and "[run] skip:" in again.stdout  # the child's manifest matches

    plotted = run_pipeline("run", "--config", config, "--only", "plot", timeout=300)
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    assert "figure:" in plotted.stdout


@needs_corpus
def test_an_eval_whose_child_fails_is_one_error_line(tmp_path, grid):
    with FakeOpenAI(model="other-model") as server:  # up, but serving another model
        proc = run_pipeline("run", "--config", str(grid(f"{server.url}/v1")), "--only", "eval", timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == proc.stderr.strip().splitlines()[-1:]
    assert errors[0].startswith("error: eval ") and "'big-model' is not served by" in errors[0]


def test_the_documented_70b_teacher_copy_of_the_paper_grid_serves_the_70b_in_both_teacher_units(tmp_path):
    """docs/full-scale.md's command for a node that cannot hold the 405B, run as written (sed over
    configs/paper.yaml): the copy's teacher phase needs the 70B-Instruct for generate AND for the
    teacher's own prompted eval (both in that phase, one server), and nothing names the 405B."""
    import re
    import subprocess

    doc = (REPO / "docs" / "full-scale.md").read_text()
    [command] = [block for block in re.findall(r"```bash\n(.*?)```", doc, re.S) if "paper-70b-teacher.yaml" in block]
    copy = tmp_path / "configs" / "paper-70b-teacher.yaml"
    copy.parent.mkdir()
    (tmp_path / "configs" / "paper.yaml").write_text((REPO / "configs" / "paper.yaml").read_text())
    subprocess.run(["bash", "-euc", command], cwd=tmp_path, check=True)
    cfg = build(RunConfig, read_yaml(copy))
    units = plan(cfg, [build(Student, s) for s in cfg.students])
    teacher = [u for u in units if u.phase == "teacher"]
    assert [u.title for u in teacher] == ["generate: the teacher writes trajectories",
                                          "eval: llama-3.1-70b-instruct-teacher prompted"]
    assert all(u.needs.startswith("needs meta-llama/Llama-3.1-70B-Instruct served at http://127.0.0.1:8000/v1")
               for u in teacher)
    assert "405" not in "\n".join(f"{u.title} {u.needs}" for u in units)
    assert str(cfg.out_dir) == "runs/paper-70b-teacher" and cfg.experiment == "paper-70b-teacher"
