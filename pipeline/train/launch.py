"""Where this process sits in a training launch, from the variables `accelerate launch` sets for
each process (WORLD_SIZE, RANK, LOCAL_WORLD_SIZE, ACCELERATE_USE_DEEPSPEED / _FSDP / _CPU and the
ZeRO stage), read once into a `Launch`; or foreseen from an accelerate config by the process that
launches it (the `train` stage, `run`), before any worker exists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").lower() in ("1", "true")


@dataclass(frozen=True)
class Launch:
    world_size: int = 1  # processes in the whole launch, every machine's
    rank: int = 0  # this process's, 0 .. world_size - 1
    local_world_size: int = 1  # processes on this machine
    strategy: str = "plain"  # plain | ddp | zero2 | zero3 | fsdp
    use_cpu: bool = False  # a CPU launch: its processes are tied to no GPU

    @property
    def deepspeed(self) -> bool:
        return self.strategy.startswith("zero")

    @property
    def rank0(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Launch:
        env = os.environ if env is None else env
        world = int(env.get("WORLD_SIZE", "1"))
        if _flag(env, "ACCELERATE_USE_DEEPSPEED"):
            strategy = f"zero{env.get('ACCELERATE_DEEPSPEED_ZERO_STAGE', '2')}"
        elif _flag(env, "ACCELERATE_USE_FSDP"):
            strategy = "fsdp"
        else:
            strategy = "ddp" if world > 1 else "plain"
        return cls(world, int(env.get("RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", world)), strategy,
                   _flag(env, "ACCELERATE_USE_CPU"))

    @classmethod
    def foreseen(cls, distributed_type: str | None, world_size: int) -> Launch:
        """The launch an accelerate config's `distributed_type` will make of `world_size`
        processes, as the launching process sees it (the ZeRO stage is the DeepSpeed JSON's,
        settled in the workers: "zero" here)."""
        strategy = {"DEEPSPEED": "zero", "FSDP": "fsdp"}.get(distributed_type or "")
        return cls(world_size, strategy=strategy or ("ddp" if world_size > 1 else "plain"))


def launch_strategy(env: Mapping[str, str] | None = None) -> str:
    """plain | ddp | zero2 | zero3 | fsdp, from the variables `accelerate launch` sets."""
    return Launch.from_env(env).strategy


def deepspeed_variables() -> dict[str, str]:
    """The variable `accelerate launch` sets for a DeepSpeed launch: the launching process settles
    the DeepSpeed JSON with it as every rank will (pipeline/train/preflight.py)."""
    return {"ACCELERATE_USE_DEEPSPEED": "true"}
