"""`python -m pipeline train`: pick an accelerate config and launch `pipeline.finetune` with it.

    python -m pipeline train --config configs/students/smollm2-135m.yaml format=react dataset_dir=data/sft
    python -m pipeline train --config configs/students/tiny.yaml accelerate_config=cpu_ddp
    python -m pipeline train --config configs/students/llama-3.1-8b.yaml --dry-run   # print the command

`accelerate_config` (a config key, or --accelerate-config) is a name under accelerate_configs/
(cpu, cpu_ddp, single_gpu, multi_gpu, deepspeed_zero2, deepspeed_zero3, deepspeed_zero3_offload,
fsdp), a path to a YAML file, or `auto`: no GPU -> cpu, one GPU -> single_gpu, several ->
multi_gpu over all of them. The config is resolved once (steps, names, folders) and written to
<output_dir>/finetune_config.yaml; the launch reads that file (`accelerate launch ... -m
pipeline.finetune --config <output_dir>/finetune_config.yaml`). The batch split is checked before
anything starts; the training output is streamed through; the exit code is the launch's.

Before launching, and before the resolved config is written, what the child would refuse is
checked here, by the one list `run` checks too (pipeline/train/preflight.py: the accelerate config,
a DeepSpeed config with no GPU in sight unless `deepspeed_on_cpu=true`, QLoRA or an 8-bit optimizer
without a GPU and bitsandbytes, an embedded model's package, a `resume` path, the output folder; the
student, the dataset present, complete and not empty, an example over max_length under
long_examples=error); `--dry-run` runs the same list. When the child stops on an error, its one
line and exit code are relayed, without the launcher's traceback.

Several machines (docs/several-nodes.md): run `python -m pipeline train` once on
every machine (under SLURM: `srun --ntasks-per-node=1`, scripts/slurm/train.sbatch). The machine
count and this machine's rank come from --num-machines / --machine-rank, else from SLURM
(SLURM_STEP_NUM_NODES or SLURM_NNODES, SLURM_NODEID); machine 0's address and port from
--main-process-ip / --main-process-port, else MASTER_ADDR / MASTER_PORT (default port 29500).
`num_processes` stays the processes on this machine; the launch gets the total
(`accelerate launch --num_processes` counts every machine's) and the batch is split over all.
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

from pipeline.core.config import add_config_arguments, read_yaml, stage_config
from pipeline.train import shm_op
from pipeline.train.config import FinetuneConfig, resolve
from pipeline.train.launcher import (  # noqa: F401  (ACCELERATE_CONFIGS, gpu_count, ...: re-exported for run and tests)
    ACCELERATE_CONFIGS,
    DEFAULT_PORT,
    FINETUNE_MODULE,
    Machines,
    add_launch_arguments,
    exit_after_save,
    gpu_count,
    holding_output,
    launch,
    launch_command,
    launch_world,
    machines_from,
    machines_from_args,
    pick_accelerate_config,
    processes_for,
    write_config_file,
)
from pipeline.train.plan import foreseen
from pipeline.train.preflight import check_training_inputs, preflight_launch

RESOLVED_CONFIG = "finetune_config.yaml"  # the resolved config, beside the checkpoints


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FinetuneConfig)
    add_launch_arguments(parser)


def write_resolved_config(cfg: FinetuneConfig, dry_run: bool = False) -> Path:
    """The resolved config as YAML in <output_dir>: what the launched processes read, and a
    record of what this run was asked to do. A dry run prints it instead of writing it."""
    return write_config_file(cfg, Path(cfg.output_dir) / RESOLVED_CONFIG, dry_run, label="train")


def main(args: argparse.Namespace) -> int:
    cfg = stage_config(FinetuneConfig, args, section="train", finish=resolve)
    machines = machines_from_args(args)
    return train(cfg, accelerate_config=args.accelerate_config, num_processes=args.num_processes,
                 dry_run=args.dry_run, machines=machines)


def train(cfg: FinetuneConfig, *, accelerate_config: str | None = None, num_processes: int | None = None,
          dry_run: bool = False, machines: Machines | None = None) -> int:
    """Launch pipeline.finetune under accelerate with the resolved `cfg`; return the exit code.
    `run` calls this for each student x format. `machines`: default from the environment."""
    machines = machines_from() if machines is None else machines
    here = launch_world(accelerate_config or cfg.accelerate_config, num_processes or cfg.num_processes)
    config_path, num_processes, gpus = here.config, here.processes, here.gpus
    world = num_processes * machines.count
    preflight_launch(cfg, config_path, world, gpus)  # before the resolved config is written into output_dir; a dry run too
    planned = foreseen(cfg, read_yaml(config_path), world, gpus)
    per_device, accum, capped = planned.batch
    check_training_inputs(cfg)
    with holding_output(cfg.output_dir, machines, dry_run):  # before a byte of output_dir is rewritten
        cmd = launch_command(config_path, num_processes, write_resolved_config(cfg, dry_run), gpus, machines,
                             precision=planned.precision.precision)
        where = "" if machines.count == 1 else f" ({num_processes} here, {machines.describe()})"
        print(f"[train] {cfg.format} / {cfg.student_name}: batch {cfg.global_batch_size} = {per_device} x {accum} "
              f"accumulation x {world} processes{where}, {cfg.max_steps} steps -> {cfg.output_dir}")
        if capped:
            print(f"[train] {capped}")
        print("[train] " + shlex.join(cmd), flush=True)
        if dry_run:
            return 0
        shm_op.before_launch(config_path, gpus)  # DeepSpeed's CPU op built once, a stale build lock cleared
        started = time.time()
        return exit_after_save(launch(cmd), Path(cfg.output_dir) / "final", started, "train")

