"""Checkpoint completeness under every strategy, the resume layout rule, and the config-time
refusals (pipeline/train_checks.py). Fast: files on disk and plain values, no training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.train_checks import (
    Layout,
    check_config,
    check_devices,
    check_resume_layout,
    is_complete_checkpoint,
    launch_strategy,
    saved_layout,
)


def checkpoint(root: Path, step: int, files: dict[str, bytes | None]) -> Path:
    """checkpoint-<step> with the given files (None: a folder), trainer_state.json last."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    for name, data in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            target.mkdir()
        else:
            target.write_bytes(data)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


# What each strategy writes (transformers Trainer._save_checkpoint, accelerate fsdp_utils, DeepSpeed).
LAYOUTS = {
    "plain/ddp": {"model.safetensors": b"w", "optimizer.pt": b"o", "scheduler.pt": b"s"},
    "plain lora": {"adapter_model.safetensors": b"w", "optimizer.pt": b"o"},
    "zero2": {"model.safetensors": b"w", "latest": b"global_step4",
              "global_step4/mp_rank_00_model_states.pt": b"m",
              "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt": b"o",
              "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt": b"o"},
    "zero3 no 16-bit gather": {"latest": b"global_step4",
                               "global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt": b"m",
                               "global_step4/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": b"o"},
    "zero3 lora": {"adapter_model.safetensors": b"w", "latest": b"global_step4",
                   "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt": b"o"},
    "fsdp full": {"model.safetensors": b"w", "pytorch_model_fsdp.bin": b"m", "optimizer.bin": b"o"},
    "fsdp sharded": {"pytorch_model_fsdp_0/.metadata": b"x", "pytorch_model_fsdp_0/__0_0.distcp": b"m",
                     "optimizer_0/.metadata": b"x", "optimizer_0/__0_0.distcp": b"o"},
    "fsdp sharded lora": {"adapter_model.safetensors": b"w", "pytorch_model_fsdp_0/.metadata": b"x",
                          "optimizer_0/.metadata": b"x"},
    "fsdp per-rank": {"pytorch_model_fsdp_0_rank0.bin": b"m", "optimizer_0_rank0.bin": b"o"},
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
        check_devices({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}, cuda_devices=2)
    check_devices({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "16"}, cuda_devices=2)  # 8 nodes x 2
    check_devices({"LOCAL_WORLD_SIZE": "2"}, cuda_devices=0)  # CPU processes
    check_devices({"LOCAL_WORLD_SIZE": "8", "ACCELERATE_USE_CPU": "True"}, cuda_devices=1)


def test_qlora_stores_4bit_weights_in_the_compute_dtype():
    """ZeRO-3 / FSDP shard floating tensors of one dtype: bnb_4bit_quant_storage must be it."""
    import torch

    from pipeline.finetune import bnb_4bit_config
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

    from pipeline.finetune import FinetuneConfig, load_tokenizer, resolve_model_path
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
