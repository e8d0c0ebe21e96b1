"""What `run --rehearse --print-config` refuses of a grid as the user wrote it, before any
substitution (pipeline/stages/grid/node_fit.py, pipeline/train/memory.py): the user's own values,
tensor parallel above the node's GPUs, a launch over the node's memory (with the setting that would
make it fit), vLLM's CPU build missing; and that a refused plan writes nothing. Grids are the
shipped paper grid with overrides, and grids of a user's own making written here, planned by the
real command line in this process (pipeline.cli.main).

    .venv/bin/python -m pytest tests/test_node_fit.py -q
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pipeline import cli
from pipeline.core.errors import PipelineError
from pipeline.train import memory
from pipeline.train.memory import KNOWN_SHAPES, Launch

REPO = Path(__file__).resolve().parents[1]
QWEN7 = KNOWN_SHAPES["qwen/qwen2.5-7b"]
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the grids name their student configs relative to the repository


def rehearse_plan(capsys, grid: str, out: Path, *overrides: str) -> tuple[int, str, str]:
    """`run --config <grid> --rehearse --print-config out_dir=<out> ...`: (exit code, stdout, stderr)."""
    code = cli.main(["run", "--config", grid, "--rehearse", "--print-config", f"out_dir={out}", *overrides])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def own_grid(tmp_path: Path, students: list[dict], node: dict, teacher: dict | None = None) -> str:
    """A user's grid: the paper grid's sections with these students, this node and this teacher."""
    grid = yaml.safe_load((REPO / "configs/paper.yaml").read_text())
    grid["students"], grid["node"] = students, node
    if teacher is not None:
        grid["generate"]["teacher"] = teacher
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return str(path)


# ---- the estimate ---------------------------------------------------------------------------


def test_model_states_are_deepspeeds_own_estimates_for_full_fine_tuning():
    """ZeRO-2, ZeRO-3 and ZeRO-3 with offload: the figures DeepSpeed's estimators give."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    n, largest = QWEN7.params, QWEN7.largest_layer
    for gpus in (1, 4, 8):
        launch = Launch(QWEN7, "zero2", gpus, "full", 16, ALL, 1, 512, True, True)
        assert memory.model_states(launch) == pytest.approx(
            estimate_zero2_model_states_mem_needs(n, gpus, cpu_offload=False)[1], rel=1e-6)
        zero3 = Launch(QWEN7, "zero3", gpus, "full", 16, ALL, 1, 512, True, True)
        assert memory.model_states(zero3) == pytest.approx(
            estimate_zero3_model_states_mem_needs(n, largest, gpus, cpu_offload=False)[1], rel=1e-6)
        offload = Launch(QWEN7, "zero3_offload", gpus, "full", 16, ALL, 1, 512, True, True)
        assert memory.model_states(offload) == estimate_zero3_model_states_mem_needs(n, largest, gpus)[1]


def test_a_shape_counts_the_parameters_transformers_builds(smollm2_dir):
    """The parameter count from a config.json is the model's own (built on the meta device), and
    the table's Qwen2.5-7B is its header's 7.62e9."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((Path(smollm2_dir) / "config.json").read_text())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    assert memory.shape_of(config).params == sum(p.numel() for p in model.parameters())
    assert QWEN7.params / 1e9 == pytest.approx(7.62, abs=0.01)


def test_the_estimate_agrees_with_the_student_configs_headers():
    """configs/students/qwen2.5-7b.yaml: ZeRO-2 on 8 GPUs, 30 GB of model states (16 B sharded:
    the header leaves out DeepSpeed's 16-bit gradient partition, 2 B) and ~34 GB with activations
    at 8 x 600 tokens: within 10%."""
    launch = Launch(QWEN7, "zero2", 8, "full", 16, ALL, 8, 600, True, True)
    assert memory.model_states(launch) / 1e9 == pytest.approx(30, rel=0.1)
    assert memory.estimate(launch).total / 1e9 == pytest.approx(34, rel=0.1)


def test_lora_and_qlora_hold_the_frozen_base_and_train_only_the_adapter():
    full = Launch(QWEN7, "ddp", 1, "full", 16, ALL, 1, 512, True, True)
    lora = Launch(QWEN7, "ddp", 1, "lora", 16, ALL, 1, 512, True, True)
    qlora = Launch(QWEN7, "ddp", 1, "qlora", 16, ALL, 1, 512, True, True)
    adapter = memory.adapter_params(QWEN7, 16, ALL)
    assert memory.model_states(full) == 18 * QWEN7.params  # accelerate estimate-memory's 18 B per parameter
    assert memory.model_states(lora) == 2 * QWEN7.params + 18 * adapter
    assert memory.model_states(qlora) < memory.model_states(lora) / 2  # 4-bit, the embeddings 16-bit


def test_checkpointing_and_a_smaller_micro_batch_lower_the_activations():
    base = Launch(QWEN7, "zero2", 8, "full", 16, ALL, 8, 2048, False, True)
    checkpointed = Launch(QWEN7, "zero2", 8, "full", 16, ALL, 8, 2048, True, True)
    assert memory.activations(checkpointed) < memory.activations(base) / 5
    assert memory.activations(Launch(QWEN7, "zero2", 8, "full", 16, ALL, 1, 2048, True, True)) < memory.activations(checkpointed)
    # the model's own loss builds the fp32 logits and their gradient: 8 B per token and vocabulary word
    unchunked = Launch(QWEN7, "zero2", 8, "full", 16, ALL, 8, 2048, True, False)
    assert memory.activations(unchunked) - memory.activations(checkpointed) == 8 * 8 * 2048 * QWEN7.vocab


# ---- the plan -------------------------------------------------------------------------------


def test_a_7b_full_fine_tune_on_4_a100_40gb_is_refused_with_its_numbers_and_the_setting_that_fits(
        in_repo, tmp_path, capsys):
    """Issue 59's grid: Qwen2.5-7B full, ZeRO-2, on 4 x 40 GB: ~50 GB per GPU (its own header's
    arithmetic gives ~49) is refused at plan time, naming a setting whose estimate fits; nothing written."""
    grid = own_grid(tmp_path, [{"name": "qwen7", "config": "configs/students/qwen2.5-7b.yaml", "size_class": "8b",
                                "params_b": 7.6}], {"gpus": 4, "gpu_mib": 40960})
    code, _, err = rehearse_plan(capsys, grid, tmp_path / "run")
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    found = re.search(r"train: qwen7 on react: 4 processes of deepspeed_zero2 need ~([\d.]+) GiB .* more than the "
                      r"GPU's 40\.0 GiB \(40960 MiB\); set (.+?) \(([\d.]+) GiB\)", line)
    assert found, line
    assert 45 < float(found[1]) < 60 and float(found[3]) <= 40
    assert not (tmp_path / "run-rehearsal").exists()


def test_a_llama_8b_lora_on_4_a100_40gb_fits_and_the_plan_says_both_launches(in_repo, tmp_path, capsys):
    grid = own_grid(tmp_path, [{"name": "llama8", "config": "configs/students/llama-3.1-8b.yaml", "size_class": "8b",
                                "params_b": 8.0, "train": {"finetuning": "lora"}}], {"gpus": 4, "gpu_mib": 40960})
    code, out, err = rehearse_plan(capsys, grid, tmp_path / "run")
    assert code == 0, err
    # the stand-in's launch here, and beneath it the node's, with its estimate beside the GPU's memory
    assert re.search(r"launches accelerate with 2 processes \(deepspeed_zero2; .*\n#\s+on the target node: 4 processes "
                     r"of deepspeed_zero2: ~[\d.]+ GiB \(weights/gradients/optimizer [\d.]+ .*\) per GPU of the node's "
                     r"40\.0 GiB: fits", out), out[:3000]


@pytest.mark.parametrize("override, refused", [
    ("node.gpus=4", r"eval: llama-3.1-70b prompted, .*: model\.tensor_parallel_size 8 > the node's 4 GPUs"),
    ("node.gpu_mib=1", r"train: llama-3.1-8b on standard, .*: 8 processes of deepspeed_zero2 need ~[\d.]+ GiB"),
    ("generate.questions=trian", r"unknown question set 'trian'"),
    ("eval.questions=react-dev5000", r"unknown question set 'react-dev5000'"),
    ("generate.target_correct=-5", r"'target_correct' must be >= 1, got -5"),
    ("eval.model.tensor_parallel_size=16", r"model\.tensor_parallel_size 16 > the node's 8 GPUs"),
    ("train.accelerate_config=fsdpp", r"accelerate_config: 'fsdpp' not found"),
    ("train.global_batch_size=63", r"global_batch_size=63 does not divide over 8 processes"),
    ("train.num_processes=16", r"train: llama-3.1-8b on standard, .*: num_processes=16 but this node has 8 GPU"),
])
def test_a_mistake_in_the_grid_is_refused_before_the_rehearsal_substitutes_and_nothing_is_written(
        override, refused, in_repo, tmp_path, capsys):
    """What the real run (or the node) would refuse is refused on the grid as written: the values
    the rehearsal replaces (question sets, targets) and the node's GPUs and memory; exit 2, one
    line, and no <out_dir>-rehearsal (no tiny models) left behind."""
    code, _, err = rehearse_plan(capsys, "configs/paper.yaml", tmp_path / "paper", override)
    assert code == 2, err
    assert re.search(refused, err), err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip().splitlines()[-1]]
    assert not (tmp_path / "paper-rehearsal").exists()


def test_a_grpo_unit_counts_its_reference_model_and_colocated_vllm_and_names_the_settings_that_fit(
        in_repo, tmp_path, capsys):
    """GRPO of the paper grid's 8B with colocated vLLM rollouts and a KL reference (beta > 0): 64
    rollouts of up to 4,096 tokens, 8 per device, no checkpointing, do not fit an 80 GB GPU; no
    single setting makes them fit, two together do."""
    code, _, err = rehearse_plan(capsys, "configs/paper.yaml", tmp_path / "paper", "grpo.formats=[react]",
                                 "grpo.students=[llama-3.1-8b]", "grpo.settings={rollout: {engine: vllm, max_context: "
                                 "4096}, beta: 0.04, accelerate_config: deepspeed_zero2}")
    assert code == 2, err
    found = re.search(r"grpo: llama-3\.1-8b from its react fine-tune: 8 processes of deepspeed_zero2 need ~[\d.]+ GiB "
                      r"\(.* \+ reference model and vLLM's colocated 0\.3 share [\d.]+ \+ CUDA context 1\.0\) per GPU, "
                      r"more than the GPU's 79\.6 GiB \(81559 MiB\); set gradient_checkpointing: true and "
                      r"max_per_device_batch_size: 1 .*\(([\d.]+) GiB\)$", err.strip())
    assert found and float(found[1]) <= 79.6, err
    assert not (tmp_path / "paper-rehearsal").exists()


def test_a_qlora_grid_is_rehearsed_as_lora_and_says_what_a_cpu_cannot_show(in_repo, tmp_path, capsys):
    grid = own_grid(tmp_path, [{"name": "llama8", "config": "configs/students/llama-3.1-8b.yaml", "size_class": "8b",
                                "params_b": 8.0, "train": {"finetuning": "qlora"}}], {"gpus": 4, "gpu_mib": 40960})
    code, out, err = rehearse_plan(capsys, grid, tmp_path / "run")
    assert code == 0, err
    assert "students llama8: QLoRA -> LoRA with the same adapter" in out
    assert "Not shown on this CPU: the 4-bit base's loading and quantisation" in out
    assert re.search(r"^finetuning: lora$", out, flags=re.M)  # the rehearsed launch's config
    lora = Launch(KNOWN_SHAPES["meta-llama/llama-3.1-8b"], "zero2", 4, "lora", 16, ALL, 8, 2048, True, True)
    qlora_states = re.search(r"on the target node: 4 processes of deepspeed_zero2: ~[\d.]+ GiB \(weights/gradients/"
                             r"optimizer ([\d.]+)", out)
    assert qlora_states and float(qlora_states[1]) < memory.model_states(lora) / 2**30 / 2  # 4-bit, not 16-bit


def test_a_teacher_without_base_url_is_said_and_several_servers_share_the_node(in_repo, tmp_path, capsys):
    teacher = {"backend": "openai", "model": "meta-llama/Llama-3.1-405B-Instruct-FP8"}  # no base_url
    students = [{"name": "teacher-prompted", "config": "configs/students/llama-3.1-8b.yaml", "size_class": "540b",
                 "params_b": 405.0, "finetune": False, "eval": {"serve": None},
                 "prompt_model": {"backend": "openai", "base_url": "http://127.0.0.1:8001/v1",
                                  "model": "meta-llama/Llama-3.1-405B-Instruct-FP8"}}]
    code, out, err = rehearse_plan(capsys, own_grid(tmp_path, students, {"gpus": 4, "gpu_mib": 81559}, teacher),
                                   tmp_path / "run")
    assert code == 0, err
    assert "generate.teacher: no base_url: the default http://127.0.0.1:8000/v1" in out
    assert "teacher servers: 2 side by side (ports 8000, 8001), 2 of the node's 4 GPUs each (tensor parallel 2)" in out


def test_the_teacher_servers_get_their_own_gpus_of_the_node(tmp_path):
    from pipeline.rehearsal.rewrite import Endpoint
    from pipeline.rehearsal.session import endpoint_server

    servers = [endpoint_server(Endpoint(port, "teacher", tmp_path / "model"), tmp_path, 4, i, 2)
               for i, port in enumerate((8000, 8001))]
    assert [s.serve.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0,1", "2,3"]
    assert [s.cmd[s.cmd.index("--tensor-parallel-size") + 1] for s in servers] == ["2", "2"]


def test_a_missing_vllm_build_is_refused_at_plan_time_in_one_line(in_repo, tmp_path, capsys, monkeypatch):
    from pipeline.llm import serving

    monkeypatch.setattr(serving, "VLLM_VENV", tmp_path / "no-venv-vllm")
    code, _, err = rehearse_plan(capsys, "configs/paper.yaml", tmp_path / "paper")
    assert code == 2
    assert err.strip().splitlines()[-1] == (f"error: rehearsal: vLLM's CPU build is not at {tmp_path / 'no-venv-vllm/bin/python'}, and "
                           "every server of this grid runs on it; make it with `bash scripts/setup_vllm.sh` (a few "
                           "minutes), then re-run")
    assert not (tmp_path / "paper-rehearsal").exists()


def test_a_refusal_of_the_rehearsed_plan_after_the_models_removes_them(in_repo, tmp_path, capsys, monkeypatch):
    """A check that needs the tiny models on disk (check_selected) refusing: the models made by this
    plan are removed again."""
    from pipeline.stages import run

    def refuse(cfg, units):
        assert list((tmp_path / "paper-rehearsal" / "models").iterdir())  # written just before
        raise PipelineError("refused after the models")

    monkeypatch.setattr(run, "check_selected", refuse)
    code, _, err = rehearse_plan(capsys, "configs/paper.yaml", tmp_path / "paper")
    assert code == 2 and "refused after the models" in err
    assert not (tmp_path / "paper-rehearsal").exists()


# ---- the student configs ----------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted((REPO / "configs/students").glob("*.yaml")), ids=lambda p: p.stem)
def test_one_checkpoint_policy_across_the_student_configs(path):
    """A GPU-node student (DeepSpeed: 13-128 GB per checkpoint) deletes its checkpoints once final/
    is complete, and its header says so; a CPU student keeps its few GB."""
    config = yaml.safe_load(path.read_text())
    on_node = str(config.get("accelerate_config", "auto")).startswith("deepspeed")
    assert config.get("keep_checkpoints", True) is (not on_node)
    assert bool(re.search(r"keep_checkpoints: false\s+(#\s+)?deletes", path.read_text())) is on_node
