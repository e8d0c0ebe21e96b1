"""Fine-tuning: configs, checkpoint choice, and real training runs through `accelerate launch`.

    .venv/bin/python -m pytest tests/test_finetune.py               # all (12 min under a load average of 7-15)
    .venv/bin/python -m pytest tests/test_finetune.py -m "not slow"  # the fast checks

Slow tests launch `accelerate launch pipeline/finetune.py` with real CPU processes (one process,
DDP over gloo, DeepSpeed ZeRO-2 and ZeRO-3) on a tiny random Llama (SmolLM2 tokenizer) and real
FireAct ReAct trajectories, SIGKILL runs between checkpoints and resume them; DeepSpeed compiles
its CPU communication op on first use (1-4 min; cached in ~/.cache/torch_extensions, or
TORCH_EXTENSIONS_DIR: worktrees at different paths rebuild it for each other when they share one).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sft_testdata import DATA, fireact_records, write_dataset

from pipeline.core.config import load_config, to_dict
from pipeline.core.errors import PipelineError
from pipeline.train.checkpoints import latest_complete_checkpoint, set_aside_incomplete
from pipeline.train.checks import is_complete_checkpoint
from pipeline.train.config import PAPER_STEPS, FinetuneConfig, resolve
from pipeline.train.data import load_sft_records

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "students" / "tiny.yaml"
PYTHON = sys.executable
# Two runs of the same steps on the same data: losses agree to float32 reduction noise.
LOSS_TOLERANCE = 1e-3
LONG = 24  # steps of the reference and killed runs: enough that a kill lands before the end

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent")


def load_as_eval(final: Path):
    """(model, tokenizer) of a `final` folder the way `eval` loads it (its manifest read by
    model_under_test, the transformers backend: a LoRA adapter merged into its base), in fp32."""
    from dataclasses import replace

    from pipeline.llm.hf import TransformersLLM
    from pipeline.stages.eval import EvalConfig, model_under_test

    llm = TransformersLLM(replace(model_under_test(EvalConfig(finetuned=final)).llm, dtype="float32"))
    return llm.model, llm.tokenizer


def student(cfg: FinetuneConfig, tokenizer):
    """The student as the run loads it, under this process's plan."""
    from pipeline.train.model import load_student
    from pipeline.train.plan import plan_training

    return load_student(cfg, tokenizer, plan_training(cfg))


def tiny_cfg(tmp_path: Path, *overrides: str) -> FinetuneConfig:
    return resolve(load_config(FinetuneConfig, TINY, [f"dataset_dir={tmp_path / 'sft'}",
                                                      f"output_root={tmp_path / 'ck'}", *overrides], section="train"))


# ----------------------------------------------------------------------------- configuration

@pytest.mark.parametrize("method, size_class, steps", [
    ("react", "8b", 4000), ("act", "8b", 4000), ("standard", "8b", 2000), ("cot", "8b", 2000),
    ("react", "62b", 4000), ("act", "70b", 4000), ("standard", "62b", 1000), ("cot", "72b", 1000),
    ("cot", "7b", 2000),
])
def test_steps_default_from_the_paper(method, size_class, steps):
    cfg = resolve(load_config(FinetuneConfig, None, [f"format={method}", f"size_class={size_class}"]))
    assert cfg.max_steps == steps
    assert resolve(load_config(FinetuneConfig, None, [f"format={method}", "max_steps=7"])).max_steps == 7


def test_config_errors_and_layout():
    cfg = resolve(load_config(FinetuneConfig, None, ["experiment=exp1", "student=meta-llama/Llama-3.1-8B", "format=act"]))
    assert cfg.output_dir == Path("checkpoints/exp1/llama-3.1-8b/act")
    with pytest.raises(PipelineError, match="did you mean 'learning_rate'"):
        load_config(FinetuneConfig, None, ["learnig_rate=1e-4"])
    with pytest.raises(PipelineError, match="size_class: '13b' has no step schedule"):
        resolve(load_config(FinetuneConfig, None, ["size_class=13b"]))
    with pytest.raises(PipelineError, match="'finetuning' must be one of"):
        load_config(FinetuneConfig, None, ["finetuning=dora"])
    with pytest.raises(PipelineError, match="must be full"):
        resolve(load_config(FinetuneConfig, TINY, ["finetuning=lora"]))


def test_student_configs_load_and_state_their_cost():
    paths = sorted((REPO / "configs" / "students").glob("*.yaml"))
    assert {p.stem for p in paths} >= {"tiny", "smollm2-135m", "llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b", "qwen2.5-72b"}
    for path in paths:
        cfg = resolve(load_config(FinetuneConfig, path, section="train"))
        assert cfg.global_batch_size == (8 if path.stem == "tiny" else 64)
        header = path.read_text(encoding="utf-8")
        assert "accelerate launch" in header, f"{path.name}: no launch line"
        if path.stem not in ("tiny", "smollm2-135m"):
            assert cfg.max_steps is None or cfg.max_steps == PAPER_STEPS["8b"][cfg.format]
            for needle in ("GPU", "FLOPs", "MFU", "hours", "checkpointing", "disk per checkpoint"):
                assert needle in header, f"{path.name}: header lacks {needle}"
            # the header's retention is the config's, and the disk figure is per kept checkpoint
            assert cfg.save_total_limit and f"save_total_limit {cfg.save_total_limit} keeps" in header, path.name
            assert cfg.attn_implementation == "auto" and cfg.loss == "auto", path.name


def test_accelerate_configs_parse():
    from accelerate.commands.config.config_args import load_config_from_file
    expected = {"cpu": "NO", "cpu_ddp": "MULTI_GPU", "single_gpu": "NO", "multi_gpu": "MULTI_GPU",
                "deepspeed_zero2": "DEEPSPEED", "deepspeed_zero3": "DEEPSPEED",
                "deepspeed_zero3_offload": "DEEPSPEED", "fsdp": "FSDP"}
    for name, kind in expected.items():
        cfg = load_config_from_file(str(REPO / "accelerate_configs" / f"{name}.yaml"))
        assert str(cfg.distributed_type).split(".")[-1] == kind, name
        if kind == "DEEPSPEED":  # the settings are in the JSON the YAML names
            ds = json.loads((REPO / cfg.deepspeed_config["deepspeed_config_file"]).read_text())
            assert cfg.deepspeed_config["deepspeed_config_file"] == f"accelerate_configs/{name}.json"
            assert ds["zero_optimization"]["stage"] == {"deepspeed_zero2": 2}.get(name, 3)
            assert (ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu") == name.endswith("offload")
            assert ds["data_types"]["grad_accum_dtype"] == "fp32"
    assert load_config_from_file(str(REPO / "accelerate_configs" / "cpu_ddp.yaml")).use_cpu


@pytest.mark.parametrize("name, stage", [("deepspeed_zero2", 2), ("deepspeed_zero3", 3), ("deepspeed_zero3_offload", 3)])
def test_a_gpu_launch_hands_deepspeed_fp32_accumulation(tmp_path, monkeypatch, name, stage):
    """What a GPU node's launch gives DeepSpeed: our launch command (the planned bf16 said as --mixed_precision)
    parsed by accelerate's own launcher into the workers' environment, from a working directory
    outside the repository; the launched script settles the config file's path and ZeRO stage;
    the DeepSpeedPlugin the Trainer builds from that environment (training_args.py, with bf16
    training) holds fp32 gradient accumulation, bf16, the stage. Without data_types, DeepSpeed
    accumulates in the model dtype (engine.get_data_types)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    from pipeline.stages.train import launch_command, pick_accelerate_config
    from pipeline.train.deepspeed_setup import settle_deepspeed_config
    from pipeline.train.launch import launch_strategy

    cmd = launch_command(pick_accelerate_config(name, 8), 8, tmp_path / "c.yaml", gpus=8, precision="bf16")
    assert cmd[cmd.index("--mixed_precision") + 1] == "bf16"
    args, defaults, mixed_precision_from_file = _validate_launch_command(launch_command_parser().parse_args(cmd[3:]))
    args.deepspeed_fields_from_accelerate_config = ",".join(  # as accelerate's launch_command does
        [*defaults.deepspeed_config, *(["mixed_precision"] if mixed_precision_from_file else [])])
    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(key)
    _, env = prepare_deepspeed_cmd_env(args)  # the workers' environment
    monkeypatch.chdir(tmp_path)
    path, _ = settle_deepspeed_config(env)
    assert path == (REPO / "accelerate_configs" / f"{name}.json").resolve()
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(path) and launch_strategy(env) == f"zero{stage}"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()  # accelerate refuses YAML-and-file conflicts here (_deepspeed_config_checks)
    plugin.set_mixed_precision("bf16")
    config = plugin.deepspeed_config
    assert config["data_types"] == {"grad_accum_dtype": "fp32"} and config["bf16"]["enabled"] is True
    assert config["zero_optimization"]["stage"] == plugin.zero_stage == stage
    assert plugin.zero3_init_flag == (stage == 3)


def test_train_stage_checks_before_launching(tmp_path, capsys):
    from pipeline.cli import main
    assert main(["train", "--config", str(TINY), "--dry-run", "global_batch_size=9"]) == 2
    assert "global_batch_size=9 does not divide over 2 processes" in capsys.readouterr().err
    assert main(["train", "--config", str(TINY), "--dry-run", "accelerate_config=nope"]) == 2
    assert "accelerate_config: 'nope' not found" in capsys.readouterr().err
    assert main(["train", "--config", str(TINY), "--dry-run", f"dataset_dir={tmp_path}"]) == 2
    assert "train.jsonl not found; run `python -m pipeline filter` first" in capsys.readouterr().err  # as the real run
    write_dataset(tmp_path, "react", [])
    assert main(["train", "--config", str(TINY), "--dry-run", f"dataset_dir={tmp_path}"]) == 2
    assert "train.jsonl: no training examples" in capsys.readouterr().err  # as the real run (issue 46)
    write_dataset(tmp_path, "react", fireact_records(limit=2))
    assert main(["train", "--config", str(TINY), "--dry-run", f"dataset_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "batch 8 = 1 x 4 accumulation x 2 processes" in out
    assert "accelerate_configs/cpu_ddp.yaml --num_processes 2" in out and "-m pipeline.finetune --config" in out


def test_deepspeed_without_a_gpu_is_refused_unless_asked_for(tmp_path, monkeypatch, capsys):
    """A DeepSpeed launch with no CUDA device in sight (this machine; a job step without its GPUs)
    would train its processes on the CPU in fp32: `train` refuses it in one line before launching,
    and `deepspeed_on_cpu=true` is the explicit way to run ZeRO on CPU (the tests do)."""
    from pipeline.stages.train import train
    from pipeline.train.deepspeed_setup import check_deepspeed_device
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    cfg = tiny_cfg(tmp_path, "max_steps=3")
    write_dataset(cfg.dataset_dir, "react", fireact_records(limit=2))  # a dry run checks the dataset as the real one does
    with pytest.raises(PipelineError, match="says DeepSpeed, but this launch sees no CUDA device") as info:
        train(cfg, accelerate_config="deepspeed_zero2", dry_run=True)
    assert "deepspeed_on_cpu=true" in str(info.value) and "\n" not in str(info.value)
    assert train(tiny_cfg(tmp_path, "max_steps=3", "deepspeed_on_cpu=true"), accelerate_config="deepspeed_zero2",
                 dry_run=True) == 0
    assert train(cfg, accelerate_config="cpu_ddp", dry_run=True) == 0  # not DeepSpeed: nothing to refuse
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(PipelineError, match=re.escape("(CUDA_VISIBLE_DEVICES=''): its 8 process")):
        check_deepspeed_device(True, False, False, 8)
    check_deepspeed_device(True, True, False, 8)  # GPUs seen
    check_deepspeed_device(False, False, False, 2)  # not DeepSpeed


def test_train_hands_over_one_resolved_config(tmp_path, capsys):
    """`train` writes the resolved config beside the checkpoints and launches the module with
    it alone; reading it back gives the same config (nothing resolved twice differently)."""
    from pipeline.stages.train import RESOLVED_CONFIG, train
    cfg = tiny_cfg(tmp_path, "max_steps=3")
    write_dataset(cfg.dataset_dir, "react", fireact_records(limit=2))  # a dry run checks the dataset as the real one does
    assert train(cfg, dry_run=True) == 0
    assert not (cfg.output_dir / RESOLVED_CONFIG).exists()  # a dry run writes nothing
    out = capsys.readouterr().out
    assert f"-m pipeline.finetune --config {cfg.output_dir / RESOLVED_CONFIG}" in out
    from pipeline.stages.train import write_resolved_config
    path = write_resolved_config(cfg)
    again = resolve(load_config(FinetuneConfig, path))
    assert to_dict(again) == to_dict(cfg) and again.max_steps == 3


def test_accelerate_configs_ship_inside_the_package():
    """A non-editable install has no repository root: the configs are package data."""
    import pipeline
    from pipeline.stages.train import ACCELERATE_CONFIGS, pick_accelerate_config
    assert ACCELERATE_CONFIGS == Path(pipeline.__file__).parent / "accelerate_configs"
    shipped = sorted(p.name for p in ACCELERATE_CONFIGS.glob("*.yaml"))
    assert shipped == sorted(p.name for p in (REPO / "accelerate_configs").glob("*.yaml")) and len(shipped) == 8
    assert pick_accelerate_config("cpu_ddp", 0) == ACCELERATE_CONFIGS / "cpu_ddp.yaml"


def test_incomplete_dataset_is_refused(tmp_path):
    write_dataset(tmp_path / "sft", "react", fireact_records(limit=2), complete=False)
    with pytest.raises(PipelineError, match="incomplete"):
        load_sft_records(tiny_cfg(tmp_path))
    with pytest.raises(PipelineError, match="run `python -m pipeline filter` first"):
        load_sft_records(tiny_cfg(tmp_path, "format=act"))


def fake_checkpoint(folder: Path, step: int, *, state: str | None = None, weights=True, optimizer=True) -> Path:
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if weights:
        (path / "model.safetensors").write_bytes(b"w")
    if optimizer:
        (path / "optimizer.pt").write_bytes(b"o")
    if state is not False:
        (path / "trainer_state.json").write_text(state if state is not None else json.dumps({"global_step": step}))
    return path


def test_incomplete_checkpoints_are_never_picked(tmp_path):
    out = tmp_path / "run"
    fake_checkpoint(out, 2)
    good = fake_checkpoint(out, 4)
    fake_checkpoint(out, 6, state=False)  # killed before trainer_state.json
    fake_checkpoint(out, 8, state='{"global_st')  # torn trainer_state.json
    fake_checkpoint(out, 10, weights=False)
    fake_checkpoint(out, 12, optimizer=False)
    fake_checkpoint(out, 14, state=json.dumps({"global_step": 3}))  # state of another step
    assert latest_complete_checkpoint(out) == good
    assert not any(is_complete_checkpoint(out / f"checkpoint-{s}") for s in (6, 8, 10, 12, 14))
    moved = set_aside_incomplete(out)
    assert len(moved) == 5 and all(p.name.startswith("incomplete-checkpoint-") for p, _ in moved)
    assert [why for _, why in moved] == ["no readable trainer_state.json (the trainer writes it last)"] * 2 + [
        "no model weights", "no optimizer state", "its trainer_state.json is for step 3"]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_padding_free_batches_match_padded_ones(tmp_path, smollm2_dir):
    """Padding-free batches (one flat row, position ids restarting per example) must give the
    padded batch's logits and loss: attention must not leak across examples. (transformers
    builds the block-diagonal mask from the position ids only without a KV cache, which is
    why the trainer's loss passes use_cache=False.)"""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from pipeline.train.data import load_tokenizer
    from pipeline.train.sft import tokenize_records

    cfg = tiny_cfg(tmp_path)
    tokenizer = load_tokenizer(cfg)
    examples, _ = tokenize_records(fireact_records(limit=4), tokenizer)
    model = student(cfg, tokenizer).eval()
    outputs = {}
    for padding_free in (False, True):
        batch = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, padding_free=padding_free)(examples)
        assert ("attention_mask" in batch) != padding_free
        with torch.no_grad():
            outputs[padding_free] = model(**batch, use_cache=False)
    assert outputs[True].loss.item() == pytest.approx(outputs[False].loss.item(), abs=1e-5)
    start = 0
    for i, example in enumerate(examples):
        n = len(example["input_ids"])
        flat = outputs[True].logits[0, start:start + n]
        assert torch.allclose(flat, outputs[False].logits[i, :n], atol=1e-4), f"example {i} differs"
        start += n


def test_packed_rows_match_padded_batches(tmp_path):
    """`packing` (pipeline/train/batching.py): trajectories placed whole into fixed-length rows, the
    tail padded with positions that continue the last one. Same loss as a padded batch, and no
    attention across trajectories (per-trajectory logits equal)."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from pipeline.train.batching import PackingCollator, best_fit_decreasing, count_trajectories
    from pipeline.train.data import load_tokenizer
    from pipeline.train.sft import tokenize_records

    cfg = tiny_cfg(tmp_path)
    tokenizer = load_tokenizer(cfg)
    examples, report = tokenize_records(fireact_records(limit=5), tokenizer)
    model = student(cfg, tokenizer).eval()
    packed = PackingCollator(tokenizer.pad_token_id, max_length=2 * report.max_length)(examples)
    assert packed["input_ids"].shape == (3, 2 * report.max_length) and count_trajectories(packed) == 5
    padded = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id)(examples)
    with torch.no_grad():
        out_packed, out_padded = model(**packed, use_cache=False), model(**padded, use_cache=False)
    assert out_packed.loss.item() == pytest.approx(out_padded.loss.item(), abs=1e-5)
    rows = best_fit_decreasing([len(e["input_ids"]) for e in examples], 2 * report.max_length)
    for row, members in enumerate(rows):  # each trajectory's logits, where the collator put it
        start = 0
        for i in members:
            n = len(examples[i]["input_ids"])
            assert packed["input_ids"][row, start:start + n].tolist() == examples[i]["input_ids"]
            assert torch.allclose(out_packed.logits[row, start:start + n], out_padded.logits[i, :n], atol=1e-4)
            start += n


@pytest.mark.parametrize("batching", ["padding_free", "packing", "padded"])
def test_every_batching_mode_trains_global_batch_trajectories_per_step(tmp_path, batching):
    """Batch 8 (= 2 per device x 4 accumulation here) means 8 trajectories per optimizer step in
    every mode: counted in the batches the trainer really collates."""
    from pipeline.train.batching import count_trajectories
    from pipeline.train.data import load_tokenizer
    from pipeline.train.plan import plan_training
    from pipeline.train.sft import tokenize_records
    from pipeline.train.trainer import build_trainer

    cfg = tiny_cfg(tmp_path, f"batching={batching}", "max_steps=1", "save_steps=100", "per_device_batch_size=2")
    tokenizer = load_tokenizer(cfg)
    examples, report = tokenize_records(fireact_records(max_chars=450, limit=16), tokenizer)
    plan = plan_training(cfg)
    assert plan.batch[:2] == (2, 4)  # 2 per device x 4 accumulation, one process
    trainer = build_trainer(cfg, plan, examples, tokenizer, max_length=2 * report.max_length)
    counts: list[int] = []  # per micro-batch the model trains on (the loader collates one ahead)
    compute_loss = trainer.compute_loss

    def counting_loss(model, inputs, *args, **kwargs):
        counts.append(count_trajectories(inputs))
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = counting_loss
    trainer.train()
    assert counts == [2] * 4, counts  # 4 micro-batches of 2 trajectories
    assert sum(counts) == cfg.global_batch_size


# ----------------------------------------------------------------------------- real launches

def launch(tmp_path: Path, *overrides: str, processes: int = 2, config: str = "cpu_ddp") -> subprocess.Popen:
    # --mixed_precision no: the planned fp32, as `train` says it (pipeline/train/launcher.py).
    # precision=fp32: these runs' losses are compared with each other's at LOSS_TOLERANCE, and ZeRO
    # on CPU always trains fp32; pinned (an explicit value wins over REACT_PIPELINE_PRECISION and
    # over `auto`, which is bf16 on a CPU with bf16 units), so every side runs in one precision.
    # bf16 training is tested against fp32 at bf16's tolerance in tests/test_precision.py.
    # deepspeed_on_cpu: a DeepSpeed launch without a GPU is refused unless asked for (the tests do)
    on_cpu = ("deepspeed_on_cpu=true",) if config.startswith("deepspeed") else ()
    cmd = [PYTHON, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_configs" / f"{config}.yaml"),
           "--num_processes", str(processes), "--mixed_precision", "no",
           str(REPO / "pipeline" / "finetune.py"), "--config", str(TINY),
           f"dataset_dir={tmp_path / 'sft'}", f"output_root={tmp_path / 'ck'}", "precision=fp32", *on_cpu, *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = tempfile.NamedTemporaryFile("w+", prefix="launch-", suffix=".log", dir=tmp_path, delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    proc.log_path = Path(log.name)
    return proc


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:  # leave no launch training in the background
        kill_tree(proc)
        proc.wait()
        raise
    out = proc.log_path.read_text(encoding="utf-8", errors="replace")
    assert proc.returncode == 0, out[-4000:]
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launch and every process under it. torchrun puts its workers in their own
    process groups, so killing the launcher's group alone leaves them training."""
    import psutil
    launcher = psutil.Process(proc.pid)
    for p in [launcher, *launcher.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)


def losses_by_step(checkpoint: Path) -> dict[int, float]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return {row["step"]: row["loss"] for row in state["log_history"] if "loss" in row}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, smollm2_dir):  # tiny.yaml trains with the SmolLM2 tokenizer
    root = tmp_path_factory.mktemp("ft")
    # 16 real FireAct ReAct trajectories of <= 450 characters (92-129 tokens): batch 8 spans epochs,
    # and every epoch cuts into whole batches under any split (so the strategies' runs compare)
    write_dataset(root / "sft", "react", fireact_records(max_chars=450, limit=16))
    return root


@pytest.fixture(scope="module")
def reference_run(dataset):
    """An uninterrupted 2-process run of 24 steps, checkpoints every 3 (the last 3 kept)."""
    # peak_tflops declared (a CPU is in no GPU table), so the log carries MFU too
    out = finish(launch(dataset, "experiment=ref", f"max_steps={LONG}", "save_steps=3", "peak_tflops=0.1"))
    return dataset / "ck" / "ref" / "tiny" / "react", out


@pytest.mark.slow
def test_ddp_run_learns_checkpoints_and_saves_final(dataset, reference_run):
    import torch
    from safetensors.torch import load_file

    from pipeline.train.data import load_tokenizer

    out_dir, log = reference_run
    assert "1 per device x 4 accumulation x 2 processes" in log
    assert log.count("[finetune] launch: ddp over 2 process(es)") == 1  # the plan, printed once (rank 0)
    kept = sorted(out_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in kept] == [f"checkpoint-{LONG - 6}", f"checkpoint-{LONG - 3}", f"checkpoint-{LONG}"]
    assert all(is_complete_checkpoint(p) for p in kept)
    losses = losses_by_step(out_dir / f"checkpoint-{LONG}")
    assert sorted(losses) == list(range(1, LONG + 1))
    # throughput per logged step, from the Trainer's own log (pipeline/train/flops.py)
    rows = [r for r in json.loads((out_dir / f"checkpoint-{LONG}" / "trainer_state.json").read_text())["log_history"] if "loss" in r]
    # step 1 (the launch's warm-up) has no figures; every later logged step has them
    assert rows[0]["step"] == 1 and "mfu" not in rows[0] and "tokens_per_s_per_device" not in rows[0]
    assert all(r["tokens_per_s_per_device"] > 0 and 0 < r["mfu"] <= r["hfu"] for r in rows[1:]), rows[-1]
    assert "attention: sdpa (CPU" in log and "loss: model (CPU" in log
    assert losses[LONG] < losses[1] - 1.0, losses  # 10.8 (= ln 49152) -> well below
    manifest = json.loads((out_dir / "final" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["steps"] == LONG and manifest["adapter"] is False
    assert manifest["format"] == "react" and manifest["num_processes"] == 2 and manifest["tokenizer"] == "."
    assert manifest["lengths"]["n_too_long"] == 0 and manifest["eos_token"] == "<|im_end|>"
    # every trainable parameter moved away from its (seeded) initial value
    cfg = tiny_cfg(dataset)
    initial = student(cfg, load_tokenizer(cfg)).state_dict()
    final = load_file(out_dir / "final" / "model.safetensors")
    assert set(final) <= set(initial) and len(final) >= len(initial) - 1  # tied lm_head is stored once
    unchanged = [name for name, tensor in final.items() if torch.equal(tensor, initial[name])]
    assert not unchanged, unchanged
    model, tokenizer = load_as_eval(out_dir / "final")  # what eval loads
    assert model.config.vocab_size == len(tokenizer)


@pytest.mark.slow
def test_trls_chunked_loss_trains_on_cpu_as_the_models_own(dataset):
    """`loss: auto` is TRL's chunked loss on GPUs (pipeline.train.speed.choose_loss), which no CPU
    run takes by default: forced here, in a real 2-process launch (DDP over gloo, rank 0's kernels
    shared with rank 1 as on a GPU node), for 2 steps. It trains and saves, and each step's loss
    equals a `loss=model` launch's on the same seeded model and batches (fp32)."""
    runs, fused = {}, {}
    for loss in ("chunked", "model"):
        proc = launch(dataset, f"experiment=loss-{loss}", f"loss={loss}", "max_steps=2", "save_steps=2")
        log = finish(proc, timeout=600)
        assert f"loss: {loss} (as configured)" in log and log.count("[finetune] launch: ddp over 2 process(es)") == 1
        out_dir = dataset / "ck" / f"loss-{loss}" / "tiny" / "react"
        assert json.loads((out_dir / "final" / "manifest.json").read_text())["complete"]
        runs[loss] = losses_by_step(out_dir / "checkpoint-2")
        rows = json.loads((out_dir / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
        fused[loss] = all("entropy" in r for r in rows if "loss" in r)  # TRL logs it from the fused head's outputs
    assert fused == {"chunked": True, "model": False}  # the chunked run took TRL's fused LM head, the other not
    assert sorted(runs["chunked"]) == [1, 2]
    for step in (1, 2):
        assert runs["chunked"][step] == pytest.approx(runs["model"][step], abs=1e-3), runs


@pytest.mark.slow
def test_second_launch_resumes_at_the_right_step(dataset, reference_run):
    ref_dir, _ = reference_run
    run_dir = dataset / "ck" / "resume" / "tiny" / "react"
    finish(launch(dataset, "experiment=resume", "max_steps=6", "save_steps=3"))
    log = finish(launch(dataset, "experiment=resume", "max_steps=9", "save_steps=3"))
    assert f"resuming from {run_dir / 'checkpoint-6'}" in log
    resumed = losses_by_step(run_dir / "checkpoint-9")
    reference = losses_by_step(ref_dir / f"checkpoint-{LONG}")
    # the first launch ran a 6-step schedule; the constant LR makes steps 7-9 comparable
    for step in (7, 8, 9):
        assert resumed[step] == pytest.approx(reference[step], abs=LOSS_TOLERANCE), (step, resumed, reference)


# (accelerate config, processes, steps): the strategies that run on CPU. FSDP does not: accelerate
# enables it only for GPU process groups (test_fsdp_on_cpu_is_refused). DeepSpeed compiles its CPU
# ops on first use (~1-2 min, cached in ~/.cache/torch_extensions). One process is not among them
# (41 s of the suite): its resume matching the reference is test_second_launch_resumes_at_the_right_step,
# a killed one-process training resuming is test_run's killed grid, and setting a torn checkpoint
# aside is the same code for any number of processes.
STRATEGIES = [("cpu_ddp", 2, LONG), ("deepspeed_zero2", 2, 12), ("deepspeed_zero3", 2, 12)]


def kill_after_checkpoint(proc: subprocess.Popen, checkpoint: Path, timeout: float = 400) -> None:
    deadline = time.time() + timeout
    while not is_complete_checkpoint(checkpoint):
        assert proc.poll() is None and time.time() < deadline, f"run ended before {checkpoint.name}"
        time.sleep(0.02)
    kill_tree(proc)  # the launcher and every worker, mid-run
    proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("config, processes, steps", STRATEGIES, ids=[s[0] for s in STRATEGIES])
def test_killed_run_resumes_from_latest_complete_checkpoint(dataset, reference_run, config, processes, steps):
    """SIGKILL a real run as soon as its checkpoint-3 is complete, plant a half-written
    checkpoint beyond it, relaunch: it resumes from the latest complete checkpoint, continues
    the step count and the data order, and its losses match the uninterrupted run's."""
    if config.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    name = f"killed-{config}"
    run_dir = dataset / "ck" / name / "tiny" / "react"
    args = (f"experiment={name}", f"max_steps={steps}", "save_steps=3")
    # Every strategy trains the same 8 examples per step (16 examples cut evenly under any split),
    # all in fp32 (launch pins it), so the uninterrupted 2-process DDP run is the reference for
    # all; each run prints its largest difference from it (docs/faults.md quotes the measured
    # figures).
    reference = losses_by_step(reference_run[0] / f"checkpoint-{LONG}")
    kill_after_checkpoint(launch(dataset, *args, processes=processes, config=config), run_dir / "checkpoint-3")
    last = latest_complete_checkpoint(run_dir)
    assert last is not None and not (run_dir / "final").exists(), "the kill came after the run ended"
    start = int(last.name.split("-")[1])
    # a checkpoint half-written by a kill: weights but no trainer state yet
    torn = run_dir / f"checkpoint-{start + 2}"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"partial")

    log = finish(launch(dataset, *args, processes=processes, config=config), timeout=600)
    assert f"resuming from {last}" in log
    assert re.search(r"set aside an incomplete checkpoint: .*incomplete-checkpoint-\S+ \(no readable trainer_state", log)
    resumed = losses_by_step(run_dir / f"checkpoint-{steps}")
    assert sorted(resumed) == list(range(1, steps + 1)), "the step count must continue, none repeated"
    for step in range(start + 1, steps + 1):
        assert resumed[step] == pytest.approx(reference[step], abs=LOSS_TOLERANCE), (step, resumed, reference)
    largest = max(abs(resumed[s] - reference[s]) for s in resumed)
    print(f"\n{config}: resumed from checkpoint-{start}; largest loss difference from the DDP reference "
          f"over steps 1-{steps}: {largest:.2g}")
    # batches give distinct losses, so a repeated or skipped batch (broken data order) would show:
    # the resumed losses do not match the reference shifted by one step
    shifted = [abs(resumed[s] - reference[s + 1]) > LOSS_TOLERANCE for s in range(start + 1, steps)]
    assert sum(shifted) >= len(shifted) // 2 + 1
    final = json.loads((run_dir / "final" / "manifest.json").read_text())
    assert final["steps"] == steps and final["precision"] == "fp32"
    if config.startswith("deepspeed"):  # the real ZeRO layout, and torn copies of it (test_train_checks)
        from test_train_checks import assert_real_zero_checkpoint
        assert_real_zero_checkpoint(run_dir / f"checkpoint-{steps}", dataset, zero3=config.endswith("zero3"), adapter=False)


@pytest.mark.slow
def test_fsdp_on_cpu_is_refused(dataset):
    """accelerate turns FSDP on only for GPU process groups: on CPU the launch would silently
    train DDP. A real 2-process launch with accelerate_configs/fsdp.yaml stops at once instead."""
    proc = launch(dataset, "experiment=fsdp", "max_steps=2", config="fsdp")
    proc.wait(timeout=300)
    log = proc.log_path.read_text(encoding="utf-8", errors="replace")
    assert proc.returncode != 0 and "FSDP, which accelerate runs on GPUs only" in log, log[-3000:]
    assert not (dataset / "ck" / "fsdp").exists()


@pytest.mark.slow
def test_a_deepspeed_launch_without_a_gpu_is_refused(dataset):
    """The same refusal from the launched processes themselves (a direct `accelerate launch`
    with a DeepSpeed config, here on a machine without a GPU), before any model is loaded."""
    # the helper asks for ZeRO on CPU; the later override takes it back
    proc = launch(dataset, "experiment=ds-refused", "max_steps=2", "deepspeed_on_cpu=false", config="deepspeed_zero2")
    proc.wait(timeout=300)
    log = proc.log_path.read_text(encoding="utf-8", errors="replace")
    assert proc.returncode != 0 and "says DeepSpeed, but this launch sees no CUDA device" in log, log[-3000:]
    assert not (dataset / "ck" / "ds-refused").exists()


@pytest.mark.slow
def test_resume_on_fewer_processes_resplits_the_same_batch(dataset, reference_run):
    """A 2-process DDP checkpoint resumed by ONE process: batch 8 = 1 x 8 x 1 instead of 1 x 4 x 2,
    the same 8 examples per step in the same order (16 examples: every epoch cuts evenly), so the
    losses continue the 2-process reference run's."""
    ref_dir, _ = reference_run
    run_dir = dataset / "ck" / "resplit" / "tiny" / "react"
    finish(launch(dataset, "experiment=resplit", "max_steps=6", "save_steps=3"))
    log = finish(launch(dataset, "experiment=resplit", "max_steps=9", "save_steps=3", processes=1, config="cpu"))
    assert "re-split: batch 8 = 1 per device x 8 accumulation x 1 processes (plain) (was 8 = 1 per device" in log
    resumed = losses_by_step(run_dir / "checkpoint-9")
    reference = losses_by_step(ref_dir / f"checkpoint-{LONG}")
    for step in (7, 8, 9):
        assert resumed[step] == pytest.approx(reference[step], abs=LOSS_TOLERANCE), (step, resumed, reference)


@pytest.mark.slow
def test_lora_adapter_saves_reloads_merges(tmp_path, smollm2_dir):
    """LoRA on the real SmolLM2-135M, one process, in-process trainer: the adapter is saved with
    a manifest, reloads on its base, and merged weights give the adapter's outputs."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from pipeline.hub.models import resolve_model_path
    from pipeline.train.run import run

    write_dataset(tmp_path / "sft", "react", fireact_records(max_chars=400))
    cfg = resolve(load_config(FinetuneConfig, REPO / "configs" / "students" / "smollm2-135m.yaml", [
        f"dataset_dir={tmp_path / 'sft'}", f"output_root={tmp_path / 'ck'}", "finetuning=lora", "max_steps=2",
        "global_batch_size=2", "max_examples=4", "learning_rate=1.0e-2", "save_steps=100", "report_to=none",
        "lora.r=4", "lora.alpha=8", "lora.target_modules=[q_proj,v_proj]", "lora.dropout=0.0"], section="train"))
    manifest = run(cfg)
    final = cfg.output_dir / "final"
    assert manifest["adapter"] is True and manifest["base_model"] == resolve_model_path("smollm2")
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    card = (final / "README.md").read_text()  # our model card, not PEFT's template (pipeline.hub.cards)
    assert "library_name: \"peft\"" in card and "fine-tuned on react trajectories" in card
    assert "| steps | 2 of 2 |" in card and "Not evaluated yet" in card
    ids = torch.tensor([[17872, 42, 617, 47, 198, 1082, 3779, 216, 33, 42]])
    base = AutoModelForCausalLM.from_pretrained(manifest["base_model"]).eval()
    with torch.no_grad():
        base_logits = base(ids).logits
        adapted = PeftModel.from_pretrained(base, final).eval()
        adapter_logits = adapted(ids).logits
        merged, _ = load_as_eval(final)
        merged_logits = merged.eval()(ids).logits
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert (adapter_logits - base_logits).abs().max() > 1e-3, "the trained adapter changes nothing"
    assert torch.allclose(merged_logits, adapter_logits, atol=1e-4)


@pytest.mark.slow
def test_deepspeed_zero2_on_cpu(dataset, reference_run):
    """DeepSpeed ZeRO-2 with 2 CPU processes (gloo, fp32): same losses as DDP, a DeepSpeed
    checkpoint that counts as complete, a final model. On a fresh machine DeepSpeed first
    compiles its shm_comm op (~60-120 s, cached in ~/.cache/torch_extensions)."""
    pytest.importorskip("deepspeed")
    ref_dir, _ = reference_run
    run_dir = dataset / "ck" / "zero2" / "tiny" / "react"
    proc = launch(dataset, "experiment=zero2", "max_steps=3", "save_steps=3", config="deepspeed_zero2")
    log = finish(proc, timeout=400)
    assert "1 per device x 4 accumulation x 2 processes" in log
    checkpoint = run_dir / "checkpoint-3"
    assert (checkpoint / "latest").is_file() and is_complete_checkpoint(checkpoint)
    losses, reference = losses_by_step(checkpoint), losses_by_step(ref_dir / f"checkpoint-{LONG}")
    # both sides fp32 (launch pins it): the same numbers up to reduction order
    assert json.loads((ref_dir / "final" / "manifest.json").read_text())["precision"] == "fp32"
    for step in (1, 2, 3):
        assert losses[step] == pytest.approx(reference[step], abs=LOSS_TOLERANCE), (step, losses, reference)
    final = json.loads((run_dir / "final" / "manifest.json").read_text())
    assert final["steps"] == 3 and final["precision"] == "fp32" and final["weights"] == "fp32"
    # what DeepSpeed ran with: the shipped JSON's fp32 accumulation, in the resolved config and the engine
    ds = final["deepspeed"]
    assert ds["config_file"] == str((REPO / "accelerate_configs" / "deepspeed_zero2.json").resolve())
    assert ds["zero_stage"] == 2 and ds["data_types"] == {"grad_accum_dtype": "fp32"} and ds["bf16"] is False
    assert ds["engine_grad_accum_dtype"] == ds["engine_model_dtype"] == "float32"  # ZeRO on CPU: fp32 throughout
    assert "DeepSpeed ZeRO-2 from" in log and "accumulate over micro-batches in fp32" in log
    assert "[precision] weights: fp32" in log


@pytest.mark.slow
def test_keep_checkpoints_false_leaves_only_final(dataset):
    """The retention policy for the paper's students: once final/ is complete, every checkpoint
    folder (optimizer state: ~128 GB each for the 8B) is deleted; a re-launch finds the run done."""
    run_dir = dataset / "ck" / "prune" / "tiny" / "react"
    args = ("experiment=prune", "max_steps=2", "save_steps=1", "keep_checkpoints=false")
    log = finish(launch(dataset, *args, processes=1, config="cpu"))
    assert "keep_checkpoints: false: removed 2 checkpoint folder(s)" in log, log[-2000:]
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["final"]
    assert json.loads((run_dir / "final" / "manifest.json").read_text())["complete"]
    again = finish(launch(dataset, *args, processes=1, config="cpu"))
    assert "is already complete (2 steps); nothing to do" in again
