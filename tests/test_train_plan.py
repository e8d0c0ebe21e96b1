"""The training run resolved once into one plan (pipeline/train/plan.py): where the process sits in
the launch (read once from accelerate's variables, pipeline/train/launch.py), its precision,
attention, loss, batch split and FSDP plan, and the lines it prints. Fast, CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.config import load_config, read_yaml
from pipeline.core.errors import PipelineError
from pipeline.train.config import FinetuneConfig, resolve
from pipeline.train.launch import Launch
from pipeline.train.plan import foreseen, plan_training

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
ACCELERATE = Path(__file__).resolve().parents[1] / "accelerate_configs"
DDP = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_WORLD_SIZE": "2", "ACCELERATE_USE_CPU": "true"}


def cfg(*overrides: str) -> FinetuneConfig:
    return resolve(load_config(FinetuneConfig, None, ["global_batch_size=8", "precision=fp32", *overrides]))


def test_the_launch_is_read_once_from_accelerates_variables():
    launch = Launch.from_env(DDP)
    assert (launch.world_size, launch.rank, launch.local_world_size, launch.strategy, launch.use_cpu) == (
        2, 1, 2, "ddp", True)
    assert not launch.rank0 and not launch.deepspeed
    zero3 = Launch.from_env({"WORLD_SIZE": "8", "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"})
    assert zero3.strategy == "zero3" and zero3.deepspeed and zero3.local_world_size == 8


def test_the_plan_of_a_cpu_ddp_launch_and_its_printed_lines():
    plan = plan_training(cfg(), env=DDP, cuda=False)
    assert plan.launch.world_size == 2 and plan.distributed_cpu and not plan.bf16
    assert plan.precision.precision == plan.weights.precision == "fp32"
    assert (plan.attention, plan.loss) == ("sdpa", "model")
    assert plan.batch[:2] == (1, 4)  # padding-free under sdpa: one trajectory per micro-batch
    assert plan.fsdp.state_dict_type is None
    text = "\n".join(plan.lines(cfg()))
    for piece in ("fp32", "batch 8 = 1 per device x 4 accumulation x 2 processes", "sdpa", "loss: model",
                  "launch: ddp over 2 process(es)", "activation checkpointing off", "micro-batch: 1 trajectory"):
        assert piece in text, piece


def test_the_plan_under_fsdp_says_fsdps_checkpointing_and_saving():
    env = {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true", "FSDP_ACTIVATION_CHECKPOINTING": "true",
           "FSDP_VERSION": "2"}
    plan = plan_training(cfg("gradient_checkpointing=true"), env=env, cuda=False)
    assert plan.launch.strategy == "fsdp" and plan.fsdp.final_gather and not plan.fsdp.transformers_checkpointing
    assert "FSDP: activation checkpointing FSDP's own, checkpoints as SHARDED_STATE_DICT" in "\n".join(
        plan.lines(cfg("gradient_checkpointing=true")))


def test_the_launching_process_foresees_the_workers_plan():
    """`train` and `run` foresee from the accelerate config what the workers compute from their
    variables: the same precision, batch split and world size."""
    for name, env in (("cpu_ddp", DDP), ("cpu", {})):
        accelerate = read_yaml(ACCELERATE / f"{name}.yaml")
        world = int(env.get("WORLD_SIZE", "1"))
        ahead, worker = foreseen(cfg(), accelerate, world, gpus=0), plan_training(cfg(), env=env, cuda=False)
        assert (ahead.precision, ahead.batch, ahead.launch.world_size, ahead.launch.strategy) == (
            worker.precision, worker.batch, worker.launch.world_size, worker.launch.strategy)


def test_a_batch_that_does_not_divide_is_refused_by_the_plan():
    with pytest.raises(PipelineError, match="global_batch_size"):
        plan_training(cfg("global_batch_size=7", "per_device_batch_size=2"), env=DDP, cuda=False)


# What `accelerate launch` sets for each process: read in pipeline/train/launch.py alone.
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP",
                    "ACCELERATE_USE_CPU")


def test_the_launch_variables_are_read_in_one_place():
    import ast
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in LAUNCH_VARIABLES:
                readers.add(path.relative_to(PACKAGE).as_posix())
    assert readers == {"train/launch.py"}
