"""A training run resolved once into one plan: where this process sits in the launch (world size,
rank, strategy), the precision it trains in and the dtype the student loads in, the attention
kernel, the loss path, the batch split, FSDP's checkpointing and saving, the DeepSpeed JSON.

`pipeline.train.run` computes the plan once, before any model is loaded, prints it once (rank 0)
and hands it to every step; the launching process (`python -m pipeline train`, `run`) foresees it
from the accelerate config for its own line and its precision check. Each rule keeps its own
module: pipeline.core.precision, pipeline.train.speed (attention, loss, FSDP), pipeline.train.sft
(the batch arithmetic), pipeline.train.launch (the launch's variables).

    python -m pipeline train --config configs/students/tiny.yaml --dry-run   # the foreseen batch split
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pipeline.core import devices, precision
from pipeline.train.config import FinetuneConfig
from pipeline.train.deepspeed_setup import deepspeed_line
from pipeline.train.launch import Launch
from pipeline.train.sft import split_batch
from pipeline.train.speed import (
    FsdpPlan,
    choose_attention,
    choose_loss,
    fsdp_plan,
    launch_kernels,
    micro_batch_cap,
)


class Batch(NamedTuple):
    per_device: int
    grad_accum: int
    capped: str | None  # why the micro-batch was capped (pipeline.train.speed.micro_batch_cap), or None


@dataclass(frozen=True)
class TrainPlan:
    launch: Launch
    cuda: bool
    precision: precision.Choice  # what training computes in (bf16: autocast over fp32 master weights)
    weights: precision.Choice  # the dtype the student's weights load in
    attention: str  # attn_implementation
    attention_why: str
    loss: str  # model | chunked
    loss_why: str
    batch: Batch
    fsdp: FsdpPlan
    deepspeed: tuple[Path, dict] | None = None  # the DeepSpeed JSON this launch names, as settled

    @property
    def bf16(self) -> bool:
        return self.precision.precision == "bf16"

    @property
    def distributed_cpu(self) -> bool:
        """Several processes without a GPU: DDP over gloo, on the CPU."""
        return not self.cuda and self.launch.world_size > 1

    def lines(self, cfg: FinetuneConfig) -> list[str]:
        """The plan as the run prints it, once."""
        out = [self.precision.line("training"), self.weights.line("weights")]
        if self.deepspeed:
            out.append(deepspeed_line(*self.deepspeed))
        out.append(f"[finetune] batch {cfg.global_batch_size} = {self.batch.per_device} per device x "
                   f"{self.batch.grad_accum} accumulation x {self.launch.world_size} processes; "
                   f"{cfg.max_steps} steps; output {cfg.output_dir}")
        out.append(f"[finetune] {self.attention_why}; {self.loss_why}")
        out.append(f"[finetune] launch: {self.launch.strategy} over {self.launch.world_size} process(es); "
                   f"{self.fsdp.describe()}")
        if self.batch.capped:
            out.append(f"[finetune] {self.batch.capped}")
        return out


def plan_training(cfg: FinetuneConfig, launch: Launch | None = None, *, env: Mapping[str, str] | None = None,
                  cuda: bool | None = None, deepspeed: tuple[Path, dict] | None = None) -> TrainPlan:
    """The plan of `cfg` under `launch` (default: this process's, from `env`, default os.environ),
    on a machine with or without CUDA (default: torch's answer). `deepspeed`: the settled JSON
    (pipeline.train.deepspeed_setup.settle_deepspeed_config), for the printed plan."""
    env = os.environ if env is None else env
    launch = Launch.from_env(env) if launch is None else launch
    if cuda is None:
        cuda = devices.gpu_count() > 0
    trains_in = precision.training(cfg.precision, deepspeed=launch.deepspeed)
    # rank 0's kernels for every rank: the attention kernel sets the micro-batch, which all must share
    attention, attention_why = choose_attention(cfg.attn_implementation, launch_kernels(launch, env),
                                                trains_in.precision in ("bf16", "fp16"))
    loss, loss_why = choose_loss(cfg.loss, cuda)
    return TrainPlan(launch, cuda, trains_in, precision.weights(trains_in.precision, cfg.finetuning, launch.strategy),
                     attention, attention_why, loss, loss_why, batch_split(cfg, launch.world_size, attention),
                     fsdp_plan(cfg.gradient_checkpointing, env), deepspeed)


def batch_split(cfg: FinetuneConfig, num_processes: int, attention: str) -> Batch:
    """The global batch as per-device x accumulation x processes; an explicit
    per_device_batch_size is kept, else the largest micro-batch the batching mode allows."""
    cap, why = cfg.max_per_device_batch_size, None
    if cfg.per_device_batch_size is None:
        cap, why = micro_batch_cap(cfg.batching, attention, cap)
    per_device, accum = split_batch(cfg.global_batch_size, num_processes, cfg.per_device_batch_size, cap)
    if why:
        _, flash_accum = split_batch(cfg.global_batch_size, num_processes, None, cfg.max_per_device_batch_size)
        why += "; " + cap_cost(accum, flash_accum)
    return Batch(per_device, accum, why)


def cap_cost(accum: int, flash_accum: int) -> str:
    """What the micro-batch cap costs: more micro-batches per step, and under ZeRO-3 each one
    gathers the whole model (the 70B student's LoRA runs are bound by those gathers, so its
    ~10-19 h grow towards ~20-25 h: configs/students/llama-3.1-70b.yaml)."""
    if accum == flash_accum:
        return "no cost here: the step has as many micro-batches either way"
    return (f"cost: {accum} micro-batches per process per step instead of {flash_accum} with a varlen flash kernel; "
            f"under ZeRO-3 each micro-batch gathers the whole model, so a gather-bound run takes up to "
            f"{accum / flash_accum:g}x as long (install flash-attn built for this torch, or fetch the kernels "
            "hub's flash-attn2 ahead: docs/full-scale.md)")


def foreseen(cfg: FinetuneConfig, accelerate_config: Mapping, num_processes: int, gpus: int) -> TrainPlan:
    """The plan a launch of `num_processes` under this accelerate config (its parsed YAML) will
    compute, as the launching process sees it: the same precision and batch split; FSDP's
    settings and the ZeRO stage are the workers' to read."""
    return plan_training(cfg, Launch.foreseen(accelerate_config.get("distributed_type"), num_processes), env={},
                         cuda=gpus > 0)
