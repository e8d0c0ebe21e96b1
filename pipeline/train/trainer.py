"""The trainer of a run: TRL's SFTTrainer with the plan's loss path and throughput figures in its
log, and the SFTConfig that carries the config's optimisation keys and the plan's batch, precision,
checkpointing and devices.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from pipeline.train.config import FinetuneConfig
from pipeline.train.model import load_student, peft_config
from pipeline.train.plan import TrainPlan
from pipeline.train.speed import FsdpPlan


def sft_trainer_class(loss: str = "model"):
    """SFTTrainer with the chosen loss path (pipeline/train/speed.py: choose_loss) whose log()
    adds the throughput figures (tokens/s, TFLOP/s, MFU) of each logged step.

    loss="model": the model's own cross-entropy (Trainer.compute_loss). TRL 1.16's default loss
    runs a fused, chunked log-prob LM head whose non-Triton fallback is several times slower on
    CPU (bench/bench_train.py measures it) and gives the same loss. TRL's only switches that bypass it
    (compute_loss_func, label smoothing) still run the fused head for metrics, so the override
    is the supported route: it is the base Trainer's method. loss="chunked": TRL's own."""
    from transformers import Trainer
    from trl import SFTTrainer

    class PipelineSFTTrainer(SFTTrainer):
        throughput = None  # a pipeline.train.flops.ThroughputMeter (build_trainer sets it)

        def log(self, logs, *args, **kwargs):
            if self.throughput is not None and "loss" in logs:
                logs.update(self.throughput.metrics(self.state.num_input_tokens_seen))
            super().log(logs, *args, **kwargs)

    if loss == "chunked":
        return PipelineSFTTrainer

    class ModelLossSFTTrainer(PipelineSFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs["use_cache"] = False
            return Trainer.compute_loss(self, model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    return ModelLossSFTTrainer


def model_loss_trainer_class():
    return sft_trainer_class("model")


def sft_arguments(cfg: FinetuneConfig, plan: TrainPlan, max_length: int):
    """TRL's SFTConfig for this run: the config's optimisation keys, the plan's batch, precision,
    checkpointing and devices."""
    from trl import SFTConfig
    return SFTConfig(
        output_dir=str(cfg.output_dir),
        max_steps=cfg.max_steps,
        per_device_train_batch_size=plan.batch.per_device,
        gradient_accumulation_steps=plan.batch.grad_accum,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=math.ceil(cfg.warmup_ratio * cfg.max_steps),
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        optim=cfg.optim,
        bf16=plan.bf16,
        fp16=plan.precision.precision == "fp16",
        # Our labels are final (prompt masked, EOS trained, nothing truncated): TRL must not
        # re-tokenise, truncate, or pack the dataset (its packing would make a batch count rows,
        # not trajectories): `packing` is our collator's (pipeline/train/batching.py).
        dataset_kwargs={"skip_prepare_dataset": True},
        max_length=None,
        packing=False,
        padding_free=cfg.batching == "padding_free",
        completion_only_loss=False,
        shuffle_dataset=False,  # the trainer's seeded sampler shuffles; resume replays it exactly
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        # tokens per logged step, for MFU (one scalar all-gather per micro-batch)
        include_num_input_tokens_seen="all" if cfg.batching == "padding_free" else "non_padding",
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=cfg.dataloader_num_workers,
        remove_unused_columns=False,
        disable_tqdm=False,
        **device_arguments(plan),
        **checkpointing_arguments(SFTConfig, plan.fsdp),
    )


def checkpointing_arguments(config_class, fsdp: FsdpPlan) -> dict[str, Any]:
    """The activation-checkpointing keys of a TRL config class (SFTConfig, GRPOConfig).
    TRL turns activation (gradient) checkpointing ON by default; ours is the config's choice,
    and under FSDP it is FSDP's own (accelerate config), never transformers' too.
    transformers 5.24 renamed it to activation_checkpointing (the old name warns)."""
    checkpointing = fsdp.transformers_checkpointing
    names = {f.name for f in dataclasses.fields(config_class)}
    prefix = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    extra: dict[str, Any] = {prefix: checkpointing}
    if checkpointing:
        extra[f"{prefix}_kwargs"] = {"use_reentrant": False}
    return extra


def device_arguments(plan: TrainPlan) -> dict[str, Any]:
    """The Trainer keys that say where a launch runs (shared by SFT and GRPO)."""
    return dict(
        # DDP on CPU: accelerate's multi-process launcher does not pass the config's use_cpu on,
        # so say it here; never under DeepSpeed: with use_cpu=True the trainer silently runs without it.
        # bf16 without a GPU also needs use_cpu (transformers refuses bf16 otherwise; accelerate
        # then autocasts on the CPU).
        use_cpu=(plan.distributed_cpu or (plan.bf16 and not plan.cuda)) and not plan.launch.deepspeed,
        ddp_backend="gloo" if plan.distributed_cpu else None,
        ddp_find_unused_parameters=False if plan.distributed_cpu else None,
        dataloader_pin_memory=plan.cuda,
    )


def build_trainer(cfg: FinetuneConfig, plan: TrainPlan, examples: list[dict], tokenizer, max_length: int,
                  callbacks: list | None = None):
    """The trainer of this run: the plan's loss path, the student, the batching mode's collator,
    the throughput meter."""
    from datasets import Dataset

    from pipeline.train.batching import PackingCollator

    args = sft_arguments(cfg, plan, max_length)
    model = load_student(cfg, tokenizer, plan)
    dataset = Dataset.from_list(examples)
    collator = PackingCollator(tokenizer.pad_token_id, max_length) if cfg.batching == "packing" else None
    trainer = sft_trainer_class(plan.loss)(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                           data_collator=collator, peft_config=peft_config(cfg), callbacks=callbacks)
    trainer.throughput = throughput_meter(cfg, plan, model.config, examples)
    trainer.add_callback(trainer.throughput.callback())
    return trainer


def throughput_meter(cfg: FinetuneConfig, plan: TrainPlan, model_config, examples: list[dict]):
    import torch

    from pipeline.train.flops import ThroughputMeter, attention_length, flops_per_token, peak_tflops
    per_token = flops_per_token(model_config, full_finetuning=cfg.finetuning == "full",
                                checkpointing=plan.fsdp.checkpointing,
                                attention_length=attention_length([len(e["input_ids"]) for e in examples]))
    peak = cfg.peak_tflops or (peak_tflops(torch.cuda.get_device_name()) if plan.cuda else None)
    return ThroughputMeter(per_token, plan.launch.world_size, peak)
