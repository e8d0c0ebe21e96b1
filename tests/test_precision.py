"""Precision: the auto rule (pipeline/core/precision.py), its one line, the Trainer's CPU bf16 path, and
quality: a short training run's losses in bf16 against fp32.

    .venv/bin/python -m pytest tests/test_precision.py -q
    REACT_PIPELINE_PRECISION=bf16 .venv/bin/python -m pytest tests/...   # the suite in bf16
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sft_testdata import DATA, fireact_records, write_dataset

from pipeline.core import devices, precision
from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.train.config import FinetuneConfig, resolve

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "students" / "tiny.yaml"
# bf16 keeps 8 significant bits: one matmul's relative error is ~2^-8 = 0.4%, and a few steps of
# AdamW compound it. Measured here: the largest per-step gap over 4 steps is ~0.1% of the loss.
BF16_LOSS_RTOL = 0.02


@pytest.fixture
def native(monkeypatch):
    """Pretend the CPU does (True) or does not (False) have bf16 units, with no GPU."""
    def set_native(value: bool):
        monkeypatch.setattr(precision, "cpu_bf16", lambda flags=None: (value, "test: native" if value else "test: none"))
        monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    monkeypatch.delenv(precision.ENV, raising=False)
    return set_native


def test_cpu_flags_decide_native_bf16(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    assert precision.cpu_flags(cpuinfo) >= {"avx512_bf16", "avx2"}
    assert precision.cpu_bf16({"avx2", "avx512_bf16", "amx_bf16"}) == (True, "the CPU has avx512_bf16 and amx_bf16")
    assert precision.cpu_flags(tmp_path / "absent") == set()


def test_this_machine_is_reported_consistently(monkeypatch):
    """Whatever this CPU is, the flags and torch's report agree with the choice auto makes."""
    monkeypatch.delenv(precision.ENV, raising=False)
    native, why = precision.cpu_bf16()
    flags = precision.cpu_flags()
    if any(f in flags for f in precision.NATIVE_BF16_FLAGS):
        assert native
    assert (precision.inference("auto", "cpu").precision == "bf16") == native
    assert why


def test_auto_follows_the_hardware_and_explicit_wins(native, monkeypatch):
    native(True)
    assert precision.training("auto") == precision.Choice("bf16", "test: native")
    assert precision.inference("auto", "cpu").precision == "bf16"
    assert precision.training("fp32").precision == "fp32"  # explicit always wins
    assert precision.inference("float32", "cpu") == precision.Choice("fp32", "set in the config")
    native(False)
    assert precision.training("auto") == precision.Choice("fp32", "test: none")
    assert precision.inference("auto", "cpu").precision == "fp32"
    forced = precision.training("bf16")  # asked for on a CPU without it: honoured, and the line says why it is slow
    assert forced.precision == "bf16" and "test: none" in forced.reason
    assert forced.line("training") == "[precision] training: bf16 (set in the config; test: none)"


def test_environment_replaces_auto_only(native, monkeypatch):
    native(False)
    monkeypatch.setenv(precision.ENV, "bf16")
    assert precision.training("auto") == precision.Choice("bf16", f"{precision.ENV}=bf16; test: none")
    assert precision.inference("auto", "cpu").precision == "bf16"
    assert precision.training("fp32").precision == "fp32"
    assert precision.inference("float32", "cpu").precision == "fp32"
    monkeypatch.setenv(precision.ENV, "half")
    with pytest.raises(PipelineError, match="REACT_PIPELINE_PRECISION='half': use auto, bf16 or fp32"):
        precision.training("auto")


def test_deepspeed_on_cpu_trains_in_fp32(native, monkeypatch):
    native(True)
    choice = precision.training("auto", deepspeed=True)
    assert choice.precision == "fp32" and "ZeRO on CPU needs bf16=False" in choice.reason
    monkeypatch.setenv(precision.ENV, "bf16")  # a suite-wide preference: the same one line, fp32
    assert precision.training("auto", deepspeed=True).precision == "fp32"
    with pytest.raises(PipelineError, match="bf16 under DeepSpeed on CPU is not possible"):
        precision.training("bf16", deepspeed=True)
    with pytest.raises(PipelineError, match="fp16 training needs a GPU"):
        precision.training("fp16")
    with pytest.raises(PipelineError, match="llm.dtype: unknown dtype 'half'"):
        precision.inference("half", "cpu")


@pytest.mark.parametrize("trained, finetuning, strategy, loaded", [
    ("bf16", "full", "zero2", "bf16"), ("bf16", "full", "zero3", "bf16"), ("fp16", "full", "zero3", "fp16"),
    ("bf16", "full", "plain", "fp32"), ("bf16", "full", "ddp", "fp32"), ("bf16", "full", "fsdp", "fp32"),
    ("fp32", "full", "zero2", "fp32"), ("fp32", "full", "ddp", "fp32"),
    ("bf16", "lora", "zero3", "bf16"), ("bf16", "qlora", "ddp", "bf16"), ("fp32", "lora", "plain", "fp32"),
])
def test_the_weights_load_in_what_the_strategy_keeps(trained, finetuning, strategy, loaded):
    """Full fine-tuning: fp32 master weights where the Trainer's autocast needs them, the training
    dtype under DeepSpeed (its optimizer holds the fp32 copy; it would cast fp32 weights at once)."""
    choice = precision.weights(trained, finetuning, strategy)
    assert choice.precision == loaded and choice.reason
    if finetuning == "full" and strategy.startswith("zero") and trained != "fp32":
        assert "fp32 master weights in its optimizer" in choice.reason


@pytest.mark.parametrize("env, loaded", [
    ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}, "bfloat16"),
    ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "bfloat16"),
    ({"WORLD_SIZE": "2"}, "float32"),
    ({}, "float32"),
], ids=["zero2", "zero3", "ddp", "plain"])
def test_the_student_loads_in_the_rules_dtype(tmp_path, monkeypatch, env, loaded):
    """What from_pretrained really gives a full fine-tuning run that trains in bf16, per strategy
    (a tiny Llama saved in fp32, loaded as the student). ZeRO on CPU trains in fp32 only (above),
    so bf16 training is given here; the CPU ZeRO-2 launch (tests/test_finetune.py) checks what
    runs on this machine: fp32 weights, fp32 engine."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.train.model import load_student
    from pipeline.train.plan import plan_training

    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32)).save_pretrained(tmp_path / "student")
    for key in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE", "ACCELERATE_USE_FSDP", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(precision, "training", lambda value, deepspeed=False: precision.Choice("bf16", "given by the test"))
    cfg = FinetuneConfig(student=str(tmp_path / "student"), init="pretrained", finetuning="full")
    plan = plan_training(cfg)
    model = load_student(cfg, None, plan)
    assert {str(p.dtype).removeprefix("torch.") for p in model.parameters()} == {loaded}
    assert plan.weights.torch_dtype == getattr(torch, loaded)


def test_cpu_bf16_goes_through_the_trainers_own_support(native, tmp_path):
    """bf16 on CPU: transformers refuses bf16=True without a GPU unless use_cpu=True; with it,
    accelerate autocasts the forward to bf16 on the CPU (native_amp)."""
    from dataclasses import replace

    import torch

    from pipeline.train.launch import Launch
    from pipeline.train.plan import plan_training
    from pipeline.train.trainer import sft_arguments

    native(True)
    cfg = resolve(load_config(FinetuneConfig, TINY, [f"output_root={tmp_path}", "max_steps=1"], section="train"))
    plan = plan_training(cfg, Launch())  # one process; the CPU's native bf16 (above)
    args = sft_arguments(cfg, plan, 64)
    assert args.bf16 and args.use_cpu and args.mixed_precision == "bf16"
    assert not sft_arguments(cfg, replace(plan, precision=precision.Choice("fp32", "given by the test")), 64).use_cpu
    from accelerate.utils import get_mixed_precision_context_manager
    from transformers import Trainer

    trainer = Trainer(model=torch.nn.Linear(4, 4), args=args)
    assert trainer.accelerator.mixed_precision == "bf16" and trainer.accelerator.native_amp
    with get_mixed_precision_context_manager(True):
        assert torch.nn.Linear(4, 4)(torch.ones(1, 4)).dtype == torch.bfloat16


def train_losses(tmp_path: Path, value: str, steps: int) -> tuple[list[float], dict]:
    from pipeline.train.run import run

    cfg = resolve(load_config(FinetuneConfig, TINY, [
        f"dataset_dir={tmp_path / 'sft'}", f"output_root={tmp_path / value}", f"precision={value}",
        f"max_steps={steps}", "global_batch_size=2", "per_device_batch_size=2", "save_steps=100",
        "learning_rate=1.0e-3"], section="train"))
    manifest = run(cfg)
    state = json.loads((cfg.output_dir / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    return [row["loss"] for row in state["log_history"] if "loss" in row], manifest


@pytest.mark.slow
@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent")
def test_bf16_training_losses_track_fp32(tmp_path):
    """The same 4 steps (tiny Llama, real FireAct trajectories, one in-process trainer) in fp32
    and in bf16 autocast: the per-step losses agree within BF16_LOSS_RTOL, training still
    lowers the loss, and each manifest records its precision."""
    write_dataset(tmp_path / "sft", "react", fireact_records(max_chars=450, limit=4))
    fp32, m32 = train_losses(tmp_path, "fp32", 4)
    bf16, m16 = train_losses(tmp_path, "bf16", 4)
    assert (m32["precision"], m16["precision"]) == ("fp32", "bf16")
    assert len(fp32) == len(bf16) == 4
    assert bf16 != fp32, "bf16 gave bit-identical losses: autocast was not active"
    print(f"losses fp32 {fp32}\n       bf16 {bf16}\nlargest relative gap "
          f"{max(abs(a - b) / a for a, b in zip(fp32, bf16, strict=True)):.2e}")
    for step, (a, b) in enumerate(zip(fp32, bf16, strict=True), start=1):
        assert b == pytest.approx(a, rel=BF16_LOSS_RTOL), f"step {step}: bf16 {b} vs fp32 {a}"
    assert bf16[-1] < bf16[0]
    with pytest.raises(PipelineError, match="was trained in fp32, this run would train in bf16"):
        from pipeline.train.final import check_same_precision
        check_same_precision(m32, "bf16", tmp_path / "final")


# ----------------------------------------------------------------------------- never mixed silently

def test_eval_refuses_to_mix_precisions_in_one_folder(tmp_path):
    from pipeline.core.storage import write_manifest
    from pipeline.stages.eval import check_same_precision

    check_same_precision(tmp_path, {"precision": "bf16", "train_precision": None})  # nothing there yet
    write_manifest(tmp_path / "manifest.json", stage="eval", config={}, complete=True,
                   precision="fp32", train_precision=None)
    check_same_precision(tmp_path, {"precision": "fp32", "train_precision": None})
    with pytest.raises(PipelineError, match="holds records computed in precision .*'fp32'.* would use .*'bf16'"):
        check_same_precision(tmp_path, {"precision": "bf16", "train_precision": None})


def test_run_treats_precision_as_part_of_a_units_identity(tmp_path):
    from pipeline.core.storage import is_done, write_manifest

    write_manifest(tmp_path / "manifest.json", stage="eval", config={"a": 1}, complete=True, precision="fp32")
    assert is_done(tmp_path / "manifest.json", config={"a": 1}, precision="fp32")
    assert not is_done(tmp_path / "manifest.json", config={"a": 1}, precision="bf16")


def test_eval_records_the_precision_it_ran_in(native):
    from pipeline.llm.config import LLMConfig
    from pipeline.stages.eval import ModelUnderTest, precision_record

    native(True)
    target = ModelUnderTest(LLMConfig(model="smollm2"), "m", "finetune", "135m", 0.135, "react",
                            train_precision="fp32")
    assert precision_record(target) == {"precision": "bf16", "train_precision": "fp32"}
    target.llm = LLMConfig(model="smollm2", dtype="float32")
    assert precision_record(target) == {"precision": "fp32", "train_precision": "fp32"}
    target.llm = LLMConfig(backend="openai", model="served")
    assert precision_record(target)["precision"] is None  # a remote server's precision is not ours to know


def test_plot_labels_mixed_precisions(capsys):
    from pipeline.report.summaries import check_duplicates, label_precisions

    def row(p, t=None):
        return {"model": "SmolLM2", "mode": "prompt", "size_class": "135m", "method": "react",
                "question_set": "offline-eval", "em": 0.1, "precision": p, "train_precision": t, "origin": p}
    same = [row("fp32"), dict(row("fp32"), method="act")]
    label_precisions(same)
    assert [r["model"] for r in same] == ["SmolLM2", "SmolLM2"]
    mixed = [row("fp32"), row("bf16"), row("bf16", "fp32")]
    label_precisions(mixed)
    assert [r["model"] for r in mixed] == ["SmolLM2 [fp32]", "SmolLM2 [bf16]", "SmolLM2 [fp32-trained bf16]"]
    check_duplicates(mixed)  # three models now, not one repeated
    assert "mix precisions" in capsys.readouterr().out


@pytest.mark.parametrize("planned", ["fp32", "bf16"])
@pytest.mark.parametrize("config", ["single_gpu", "multi_gpu", "fsdp"])
def test_a_gpu_launch_says_the_planned_precision_to_the_workers(config, planned, tmp_path, capsys, monkeypatch):
    """`train` on a GPU node (the count pretended: 8 GPUs with bf16) launches with the planned
    precision, and accelerate's own parser hands that to the workers, where TrainingArguments
    takes it: fp32 planned is fp32 there, not the config file's bf16 (which it took before)."""
    import shlex

    import torch
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env
    from transformers import TrainingArguments

    from pipeline.cli import main
    from pipeline.train import launcher

    monkeypatch.setattr(devices, "gpu_count", lambda: 8)
    monkeypatch.setattr(launcher, "gpu_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))  # the plan's kernels
    monkeypatch.delenv(precision.ENV, raising=False)
    write_dataset(tmp_path / "sft", "react", fireact_records(max_chars=450, limit=4))
    assert main(["train", "--config", str(TINY), "--dry-run", f"accelerate_config={config}", f"precision={planned}",
                 f"output_root={tmp_path}", f"dataset_dir={tmp_path / 'sft'}"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("[train] ") and "accelerate" in ln)
    # no flash kernel installed here: the plan caps the micro-batch and says what that costs
    assert "[train] micro-batch: 1 trajectory" in out
    assert ("cost: 8 micro-batches per process per step instead of 1" if config == "single_gpu" else  # batch 8, 1 GPU
            "no cost here") in out  # batch 8 over 8 GPUs: 1 per process either way
    cmd = shlex.split(line[len("[train] "):])
    args, *_ = _validate_launch_command(launch_command_parser().parse_args(cmd[3:]))
    for key in [k for k in __import__("os").environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(key)
    env = prepare_multi_gpu_env(args) if config != "single_gpu" else prepare_simple_launcher_cmd_env(args)[1]
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", env["ACCELERATE_MIXED_PRECISION"])
    # bf16 as the script sets it from the plan (pipeline/train/trainer.py); use_cpu: no GPU here
    trainer_args = TrainingArguments(output_dir=str(tmp_path / "o"), bf16=planned == "bf16", use_cpu=True)
    assert trainer_args.mixed_precision == {"fp32": "no", "bf16": "bf16"}[planned]
