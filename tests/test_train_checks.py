"""Checkpoint completeness under every strategy, the resume layout rule, and the config-time
refusals (pipeline/train/checks.py).

The DeepSpeed layouts are real: a module fixture (slow) trains LoRA on a tiny saved base under
ZeRO-2 (uninterrupted) and ZeRO-3 (SIGKILLed after a checkpoint, relaunched: the same losses),
2 CPU processes each, and the tests read their checkpoints, and torn copies of them; full
fine-tuning's ZeRO-2 / ZeRO-3 checkpoints are checked the same way where tests/test_finetune.py
kills and resumes them. The bf16 file names (a bf16 ZeRO run needs a GPU) come from DeepSpeed's
own naming functions. FSDP cannot run on CPU (accelerate enables it for GPUs only): its layouts
below are typed from the file names accelerate's fsdp_utils writes, not produced by a run.

    .venv/bin/python -m pytest tests/test_train_checks.py -q -m "not slow"   # files and values only
"""

from __future__ import annotations

import json
import os
import shutil
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
from sft_testdata import DATA, fireact_records, write_dataset

from pipeline.core.errors import PipelineError
from pipeline.train.checks import (
    Layout,
    check_config,
    check_devices,
    check_resume_layout,
    incomplete_reason,
    is_complete_checkpoint,
    saved_layout,
)
from pipeline.train.launch import Launch, launch_strategy


def checkpoint(root: Path, step: int, files: dict[str, bytes | None], layout: Layout | None = None) -> Path:
    """checkpoint-<step> with the given files (None: a folder), trainer_state.json last (with
    the launch layout the trainer saves, when given)."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    for name, data in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            target.mkdir()
        else:
            target.write_bytes(data)
    state = {"global_step": step}
    if layout:
        state["stateful_callbacks"] = {"LaunchLayout": {"args": vars(layout), "attributes": {}}}
    (path / "trainer_state.json").write_text(json.dumps(state))
    return path


# Typed from the writers' file names (transformers Trainer._save_checkpoint, accelerate fsdp_utils):
# plain / DDP run for real in tests/test_finetune.py; FSDP cannot run on CPU.
LAYOUTS = {
    "plain/ddp": {"model.safetensors": b"w", "optimizer.pt": b"o", "scheduler.pt": b"s"},
    "plain lora": {"adapter_model.safetensors": b"w", "optimizer.pt": b"o"},
    "fsdp full (from file names)": {"model.safetensors": b"w", "pytorch_model_fsdp.bin": b"m", "optimizer.bin": b"o"},
    "fsdp sharded (from file names)": {"pytorch_model_fsdp_0/.metadata": b"x", "pytorch_model_fsdp_0/__0_0.distcp": b"m",
                                       "optimizer_0/.metadata": b"x", "optimizer_0/__0_0.distcp": b"o"},
    "fsdp sharded lora (from file names)": {"adapter_model.safetensors": b"w", "pytorch_model_fsdp_0/.metadata": b"x",
                                            "optimizer_0/.metadata": b"x"},
    "fsdp per-rank (from file names)": {"pytorch_model_fsdp_0_rank0.bin": b"m", "optimizer_0_rank0.bin": b"o"},
}
# The same, cut short by a kill (trainer_state.json is written last, so these are the other gaps).
TORN = {
    "no optimizer": {"model.safetensors": b"w"},
    "fsdp optimizer mid-write (no .metadata)": {"pytorch_model_fsdp_0/.metadata": b"x", "optimizer_0/__0_0.distcp": b"o"},
    "fsdp model mid-write": {"pytorch_model_fsdp_0/__0_0.distcp": b"m", "optimizer_0/.metadata": b"x"},
    "deepspeed latest to a missing tag": {"model.safetensors": b"w", "latest": b"global_step4"},
    "deepspeed tag without optimizer states": {"latest": b"global_step4", "global_step4/mp_rank_00_model_states.pt": b"m"},
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_strategy_checkpoint_is_complete(tmp_path, name):
    assert is_complete_checkpoint(checkpoint(tmp_path, 4, LAYOUTS[name]))


@pytest.mark.parametrize("name", TORN)
def test_torn_checkpoints_are_incomplete(tmp_path, name):
    assert not is_complete_checkpoint(checkpoint(tmp_path, 4, TORN[name]))


# ----------------------------------------------------------------------------- DeepSpeed, by its own names

def deepspeed_files(world: int, zero3: bool, bf16: bool) -> dict[str, bytes]:
    """The files of global_step4/ that DeepSpeed 0.19's engine names for `world` ranks (its own
    naming methods, called on a stand-in holding only what they read)."""
    from deepspeed.runtime.engine import DeepSpeedEngine as Engine
    namer = SimpleNamespace(_get_zero_ckpt_prefix=partial(Engine._get_zero_ckpt_prefix, None),
                            zero_optimization_partition_weights=lambda: zero3, checkpoint_mp_rank=0)
    files = {}
    for rank in range(world):
        files[Engine._get_rank_zero_ckpt_name(namer, "", "global_step4", 0, rank, bf16)] = b"o"
        files[Engine._get_ckpt_name(namer, "", "global_step4", pp_placeholder=rank)] = b"m"  # ZeRO-2: rank 0's name
    return files | {"latest": b"global_step4"}


@pytest.mark.parametrize("zero3", [False, True], ids=["zero2", "zero3"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_a_deepspeed_checkpoint_needs_every_rank_of_its_recorded_world(tmp_path, zero3, bf16):
    pytest.importorskip("deepspeed")
    strategy = "zero3" if zero3 else "zero2"
    files = deepspeed_files(8, zero3, bf16)
    assert sum(name.endswith("optim_states.pt") for name in files) == 8
    assert any(name.startswith("global_step4/bf16_zero_pp_rank_7") for name in files) == bf16
    layout = Layout(8, 4, 2, 64, strategy, 640)
    assert incomplete_reason(checkpoint(tmp_path / "whole", 4, files, layout)) is None
    # a second node's shards not (yet) visible here: 8 of the 16 ranks that wrote the checkpoint
    why = incomplete_reason(checkpoint(tmp_path / "half", 4, files, Layout(16, 4, 1, 64, strategy, 640)))
    assert why.startswith("global_step4/ holds the optim_states.pt of 8 of the 16 ranks that wrote it (missing rank 8-15)")
    # one rank's optimizer shard missing, and (ZeRO-3) one rank's model states
    for kind in ("optim", "model") if zero3 else ("optim",):
        torn = {name: data for name, data in files.items() if f"rank_3_mp_rank_00_{kind}" not in name}
        why = incomplete_reason(checkpoint(tmp_path / kind, 4, torn, layout))
        assert why is not None and f"{kind}_states.pt of 7 of the 8 ranks" in why and "(missing rank 3)" in why
        # written before layouts were saved: the gap still shows
        assert "missing rank 3" in incomplete_reason(checkpoint(tmp_path / f"{kind}-old", 4, torn))


# ----------------------------------------------------------------------------- DeepSpeed, real runs

def assert_real_zero_checkpoint(path: Path, scratch: Path, zero3: bool, adapter: bool) -> None:
    """A real 2-process ZeRO checkpoint: DeepSpeed's files are those named above, it is complete,
    and copies of it with one rank's shard removed (rank 1: another node's, not yet visible) are not."""
    layout = saved_layout(path)
    assert layout is not None and layout.num_processes == 2 and layout.strategy == ("zero3" if zero3 else "zero2")
    tag = (path / "latest").read_text().strip()
    on_disk = {p.relative_to(path).as_posix() for p in (path / tag).iterdir()}
    expected = {name for name in deepspeed_files(2, zero3, bf16=False) if name != "latest"}
    assert on_disk == {name.replace("global_step4", tag) for name in expected}, on_disk
    assert (path / "adapter_model.safetensors").is_file() == adapter
    assert incomplete_reason(path) is None
    for name in sorted(on_disk):
        if "rank_1_" not in name:
            continue
        torn = scratch / f"torn-{path.parent.parent.parent.name}-{Path(name).name}" / path.name
        shutil.copytree(path, torn, copy_function=os.link)  # hard links: no copying
        (torn / name).unlink()
        assert "missing rank 1" in incomplete_reason(torn), name


LORA = ("finetuning=lora", "lora.r=4", "lora.alpha=8", "lora.target_modules=[q_proj,v_proj]", "lora.dropout=0.0")
LORA_STEPS = 9  # checkpoints every 3: the kill lands after checkpoint-3, well before the end


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, smollm2_dir):
    """LoRA on the tiny test model (random, saved as a base folder), 2 CPU processes: under
    ZeRO-2 uninterrupted, and under ZeRO-3 SIGKILLed once checkpoint-3 is complete, then
    relaunched. Returns their folders and the checkpoint the relaunch resumed from."""
    pytest.importorskip("deepspeed")
    if not DATA.is_dir():
        pytest.skip("../shared/data is absent")
    from test_finetune import finish, kill_after_checkpoint, launch, tiny_cfg

    from pipeline.train.checkpoints import latest_complete_checkpoint
    from pipeline.train.data import load_tokenizer
    from pipeline.train.model import load_student
    from pipeline.train.plan import plan_training

    root = tmp_path_factory.mktemp("lora-zero")
    write_dataset(root / "sft", "react", fireact_records(max_chars=450, limit=16))
    base = root / "base"
    cfg = tiny_cfg(root)
    tokenizer = load_tokenizer(cfg)
    load_student(cfg, tokenizer, plan_training(cfg)).save_pretrained(base)
    tokenizer.save_pretrained(base)
    common = (f"student={base}", f"tokenizer={base}", "init=pretrained", *LORA, f"max_steps={LORA_STEPS}", "save_steps=3")
    finish(launch(root, "experiment=z2", *common, config="deepspeed_zero2"), timeout=400)
    killed = root / "ck" / "z3" / "base" / "react"
    kill_after_checkpoint(launch(root, "experiment=z3", *common, config="deepspeed_zero3"), killed / "checkpoint-3")
    last = latest_complete_checkpoint(killed)
    assert last is not None and not (killed / "final").exists(), "the kill came after the run ended"
    log = finish(launch(root, "experiment=z3", *common, config="deepspeed_zero3"), timeout=400)
    assert f"resuming from {last}" in log
    return SimpleNamespace(root=root, zero2=root / "ck" / "z2" / "base" / "react", zero3=killed, resumed_from=last)


@pytest.mark.slow
def test_real_lora_under_zero_checkpoints_and_their_torn_copies(lora_runs):
    for run_dir, zero3 in ((lora_runs.zero2, False), (lora_runs.zero3, True)):
        assert_real_zero_checkpoint(run_dir / f"checkpoint-{LORA_STEPS}", lora_runs.root, zero3=zero3, adapter=True)


@pytest.mark.slow
def test_a_killed_lora_run_under_zero3_resumes_with_the_uninterrupted_losses(lora_runs):
    """The 70B students' setting (LoRA, ZeRO-3), SIGKILLed between checkpoints: the relaunch
    continues the step count, and every step's loss equals the uninterrupted run's (ZeRO-2: the
    same examples per step, both fp32)."""
    from test_finetune import LOSS_TOLERANCE, losses_by_step

    reference = losses_by_step(lora_runs.zero2 / f"checkpoint-{LORA_STEPS}")
    resumed = losses_by_step(lora_runs.zero3 / f"checkpoint-{LORA_STEPS}")
    assert sorted(resumed) == sorted(reference) == list(range(1, LORA_STEPS + 1))
    largest = max(abs(resumed[s] - reference[s]) for s in resumed)
    print(f"\nLoRA ZeRO-3 resumed from {lora_runs.resumed_from.name} vs uninterrupted ZeRO-2: "
          f"largest loss difference {largest:.2g}")
    assert largest <= LOSS_TOLERANCE, (resumed, reference)
    assert reference[LORA_STEPS] < reference[1], "the adapter learns nothing"
    # every step's batch gives its own loss: a repeated or skipped batch after the resume would show
    assert len({round(loss, 5) for loss in reference.values()}) == LORA_STEPS
    for run_dir in (lora_runs.zero2, lora_runs.zero3):
        manifest = json.loads((run_dir / "final" / "manifest.json").read_text())
        assert manifest["adapter"] is True and manifest["precision"] == "fp32" and manifest["steps"] == LORA_STEPS


def test_launch_strategy_from_accelerate_env():
    assert launch_strategy({}) == "plain"
    assert launch_strategy({"WORLD_SIZE": "2"}) == "ddp"
    assert launch_strategy({"WORLD_SIZE": "8", "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}) == "zero3"
    assert launch_strategy({"WORLD_SIZE": "8", "ACCELERATE_USE_FSDP": "true"}) == "fsdp"


def layout(n: int, per_device: int, strategy: str = "ddp", examples: int = 640, batch: int = 64) -> Layout:
    return Layout(n, per_device, batch // (n * per_device), batch, strategy, examples)


def test_resume_layout_same_split_and_saved_in_trainer_state(tmp_path):
    ck = checkpoint(tmp_path, 4, LAYOUTS["plain/ddp"])
    assert saved_layout(ck) is None  # a checkpoint from before layouts were saved
    assert "records no batch layout" in check_resume_layout(ck, None, layout(8, 8))
    state = {"global_step": 4, "stateful_callbacks": {"LaunchLayout": {"args": vars(layout(8, 8)) | {}, "attributes": {}}}}
    (ck / "trainer_state.json").write_text(json.dumps(state, default=str))
    assert saved_layout(ck) == layout(8, 8)
    assert check_resume_layout(ck, saved_layout(ck), layout(8, 8)) == f"resuming from {ck}"


def test_resume_layout_resplits_only_when_steps_keep_their_examples(tmp_path):
    ck = tmp_path / "checkpoint-4"
    # 640 examples = 10 whole batches: 8 x 8 x 1 and 4 x 4 x 4 cut every epoch the same way
    assert "re-split: batch 64 = 8 per device x 2 accumulation x 4 processes" in check_resume_layout(ck, layout(8, 8), layout(4, 8))
    # 650: each epoch ends in 10 examples, which 8 x 8 cannot cut evenly
    with pytest.raises(PipelineError, match=r"last 10 examples of each epoch would be cut into different batches.*--num_processes 8"):
        check_resume_layout(ck, layout(8, 8, examples=650), layout(4, 8, examples=650))
    # 648: a tail of 8, even under 1 x 8 and 2 x 4
    assert "re-split" in check_resume_layout(ck, layout(2, 4, examples=648), layout(1, 8, "plain", examples=648))


@pytest.mark.parametrize("saved, now, message", [
    (layout(8, 8, "zero3"), layout(4, 8, "zero3"), "zero3 optimizer state split over 8 processes; this launch has 4"),
    (layout(8, 8, "fsdp"), layout(4, 8, "fsdp"), "fsdp optimizer state split over 8 processes"),
    (layout(8, 8, "ddp"), layout(8, 8, "zero2"), "written under ddp, this launch runs zero2"),
    (layout(8, 8), layout(8, 4, batch=32), "global_batch_size=64, this launch has 32"),
    (layout(8, 8), layout(8, 8, examples=600), "trained on 640 examples, this launch has 600"),
])
def test_resume_layout_refusals(tmp_path, saved, now, message):
    with pytest.raises(PipelineError, match=message):
        check_resume_layout(tmp_path / "checkpoint-4", saved, now)


@pytest.mark.parametrize("args, message", [
    (("qlora", "adamw_torch", "plain", False, True), "qlora needs a CUDA GPU"),
    (("qlora", "adamw_torch", "zero3", True, False), "qlora needs bitsandbytes"),
    (("lora", "paged_adamw_8bit", "plain", True, False), "needs bitsandbytes"),
    (("full", "adamw_torch", "fsdp", False, False), "FSDP, which accelerate runs on GPUs only"),
    (("full", "adamw_bnb_8bit", "fsdp", True, True), "does not work under FSDP"),
    (("lora", "adamw_8bit", "fsdp", True, True), "does not work under FSDP"),
])
def test_config_refusals(args, message):
    with pytest.raises(PipelineError, match=message):
        check_config(*args)


def test_config_combinations_that_work_pass():
    check_config("qlora", "adamw_torch", "zero3", True, True)
    check_config("qlora", "paged_adamw_8bit", "plain", True, True)
    check_config("full", "adamw_torch_fused", "fsdp", True, False)
    check_config("lora", "adamw_torch", "zero3", False, False)  # ZeRO-3 runs on CPU (gloo)


def test_more_processes_than_gpus_is_refused_on_every_rank():
    with pytest.raises(PipelineError, match="starts 8 processes on this node, which has 2 GPU.*--num_processes 2"):
        check_devices(Launch.from_env({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}), cuda_devices=2)
    check_devices(Launch.from_env({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "16"}), cuda_devices=2)  # 8 nodes x 2
    check_devices(Launch.from_env({"LOCAL_WORLD_SIZE": "2"}), cuda_devices=0)  # CPU processes
    check_devices(Launch.from_env({"LOCAL_WORLD_SIZE": "8", "ACCELERATE_USE_CPU": "True"}), cuda_devices=1)


def test_qlora_stores_4bit_weights_in_the_compute_dtype():
    """ZeRO-3 / FSDP shard floating tensors of one dtype: bnb_4bit_quant_storage must be it."""
    import torch

    from pipeline.train.model import bnb_4bit_config
    for bf16, dtype in ((True, torch.bfloat16), (False, torch.float16)):
        config = bnb_4bit_config(bf16)
        assert config.bnb_4bit_quant_storage == config.bnb_4bit_compute_dtype == dtype


def test_train_stage_counts_gpus_for_gpu_configs():
    from pipeline.stages.train import ACCELERATE_CONFIGS, processes_for
    zero3, cpu_ddp = ACCELERATE_CONFIGS / "deepspeed_zero3.yaml", ACCELERATE_CONFIGS / "cpu_ddp.yaml"
    assert processes_for(zero3, None, gpus=1) == 1  # the file says 8
    assert processes_for(zero3, None, gpus=4) == 4
    assert processes_for(zero3, 2, gpus=0) == 2  # DeepSpeed on CPU (tests)
    assert processes_for(cpu_ddp, None, gpus=1) == 2  # CPU processes: the file's count
    with pytest.raises(PipelineError, match="num_processes=8 but this node has 2 GPU"):
        processes_for(zero3, 8, gpus=2)


def test_the_model_own_pad_token_is_used_where_the_vocabulary_has_one(tmp_path):
    """Llama-3.x ships <|finetune_right_pad_id|> (id 128004) but declares no pad token: use it,
    not EOS. A tokenizer without one keeps EOS (labels mask padding either way)."""
    from transformers import AutoTokenizer

    from pipeline.hub.models import resolve_model_path
    from pipeline.train.config import FinetuneConfig
    from pipeline.train.data import load_tokenizer
    source = AutoTokenizer.from_pretrained(resolve_model_path("smollm2"))
    source.pad_token = None
    source.save_pretrained(tmp_path / "plain")
    source.add_special_tokens({"additional_special_tokens": ["<|finetune_right_pad_id|>"]})
    source.save_pretrained(tmp_path / "llama3like")
    plain = load_tokenizer(FinetuneConfig(student=str(tmp_path / "plain")))
    assert plain.pad_token == plain.eos_token
    llama3like = load_tokenizer(FinetuneConfig(student=str(tmp_path / "llama3like")))
    assert llama3like.pad_token == "<|finetune_right_pad_id|>" != llama3like.eos_token
    assert llama3like.pad_token_id == llama3like.convert_tokens_to_ids("<|finetune_right_pad_id|>")
