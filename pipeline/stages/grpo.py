"""`python -m pipeline grpo`: GRPO of a student in the WikiEnv, launched with accelerate like `train`.

    python -m pipeline grpo --config configs/grpo/smollm2-135m.yaml \\
        student=checkpoints/small/smollm2-135m/react/final max_steps=40
    python -m pipeline grpo --config configs/grpo/llama-3.1-8b-lora.yaml student=<an 8B ReAct final/>
    python -m pipeline grpo --config ... --dry-run            # print the launch command

The config is resolved once (start, names, folders) and written to <output_dir>/grpo_config.yaml;
the launch reads that file (`accelerate launch ... -m pipeline.rl.train --config <it>`).
`accelerate_config` picks the launch as for `train` (cpu, cpu_ddp, deepspeed_zero2/3, multi_gpu,
...; auto by the GPUs present). Before launching, and before the resolved config is written,
what the child would refuse is checked here: the list every training launch checks
(pipeline/train/preflight.py: the accelerate config and devices, the optimizer, embedded models'
packages, a `resume` path, the output folder), then the start point, the batch split, the training
and held-out question sets; `--dry-run` checks the same; and the local Wikipedia index is built here if missing, so that the launched processes
only read it. The child's one error line and exit code are relayed.
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

from pipeline.core.config import (
    add_config_arguments,
    is_experiment,
    merged,
    read_section,
    read_yaml,
    stage_config,
)
from pipeline.core.precision import training
from pipeline.rl.config import (
    GrpoConfig,
    check_heldout_apart,
    check_rollout_strategy,
    resolve,
    rollout_python,
)
from pipeline.rl.plan import RlPlan
from pipeline.train import shm_op
from pipeline.train.launcher import (
    Machines,
    add_launch_arguments,
    exit_after_save,
    holding_output,
    launch,
    launch_command,
    launch_world,
    machines_from,
    machines_from_args,
    write_config_file,
)
from pipeline.train.preflight import check_question_sets, preflight_launch

GRPO_MODULE = "pipeline.rl.train"
RESOLVED_CONFIG = "grpo_config.yaml"  # the resolved config, beside the checkpoints


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, GrpoConfig)
    add_launch_arguments(parser)


def main(args: argparse.Namespace) -> int:
    cfg = stage_config(GrpoConfig, args, section="grpo", finish=resolve, read=grpo_keys)
    return grpo(cfg, accelerate_config=args.accelerate_config, num_processes=args.num_processes,
                dry_run=args.dry_run, machines=machines_from_args(args))


def grpo_keys(path: Path) -> dict:
    """A YAML's GrpoConfig keys. An experiment's `grpo:` section is `run`'s (its GrpoPhase:
    formats, config, students, settings): the keys are then its `config` file's, the grid's
    experiment and wiki, and its `settings`, as `run` layers them (pipeline.stages.grid.unit_configs.grpo_config)."""
    data = read_yaml(path)
    section = data.get("grpo")
    if not is_experiment(data) or not isinstance(section, dict):
        return read_section(path, "grpo")
    own = read_section(section["config"], "grpo") if section.get("config") else {}
    grid = {k: data[k] for k in ("experiment", "wiki") if k in data}
    return merged(own, grid, section.get("settings") or {})


def grpo(cfg: GrpoConfig, *, accelerate_config: str | None = None, num_processes: int | None = None,
         dry_run: bool = False, machines: Machines | None = None) -> int:
    """Launch pipeline.rl.train under accelerate with the resolved `cfg`; return the exit code
    (a `run` phase would call this per student, after `train`)."""
    from pipeline.rl.plan import plan_grpo

    machines = machines_from() if machines is None else machines
    here = launch_world(accelerate_config or cfg.accelerate_config, num_processes or cfg.num_processes)
    config_path, num_processes, gpus = here.config, here.processes, here.gpus
    world = num_processes * machines.count
    distributed = read_yaml(config_path).get("distributed_type")
    check_rollout_strategy(cfg.rollout.engine, "fsdp" if distributed == "FSDP" else "other")
    python = rollout_python(cfg.rollout.engine, distributed)  # vLLM rollouts: the vLLM environment's
    preflight_launch(cfg, config_path, world, gpus)  # the list `train` and `run` check (pipeline/train/preflight.py)
    plan = plan_grpo(cfg, world)  # the launched script resolves the same plan from the written config
    preflight(plan, dry_run)
    with holding_output(cfg.output_dir, machines, dry_run):  # before a byte of output_dir is rewritten
        resolved = write_config_file(cfg, Path(cfg.output_dir) / RESOLVED_CONFIG, dry_run, label="grpo")
        cmd = launch_command(config_path, num_processes, resolved, gpus, machines, module=GRPO_MODULE,
                             precision=training(cfg.precision, deepspeed=distributed == "DEEPSPEED").precision,
                             python=python)
        print(f"[grpo] {cfg.format} / {cfg.student_name}: {cfg.questions_per_step} questions x {cfg.group_size} "
              f"rollouts = {plan.batch.per_device} x {plan.batch.grad_accum} accumulation x {world} processes, "
              f"{cfg.max_steps} steps -> {cfg.output_dir}")
        print("[grpo] " + shlex.join(cmd), flush=True)
        if dry_run:
            return 0
        shm_op.before_launch(config_path, gpus)  # DeepSpeed's CPU op built once, a stale build lock cleared
        started = time.time()
        return exit_after_save(launch(cmd), Path(cfg.output_dir) / "final", started, "grpo")


def check_search_mode(cfg) -> None:
    """The rollouts' and held-out points' wiki.search mode, for the config's task, refused in
    one line before any launch (`run` checks it for each grpo unit at plan time)."""
    from pipeline.tasks import get_task
    from pipeline.wiki.config import check_search

    check_search(cfg.wiki)
    get_task(cfg.task).check_search(cfg.wiki.search)


def preflight(plan: RlPlan, dry_run: bool = False) -> None:
    """Refuse now what the launched child would refuse later, and build a missing index once.
    A dry run checks the same but fetches nothing, loads no question and writes nothing: a start
    given by hub id and the question count are checked at launch, a missing index built then."""
    from pipeline.hub.models import looks_like_path
    from pipeline.rl.start import is_ours
    from pipeline.wiki.config import open_backend

    cfg = plan.cfg
    check_question_sets(cfg)
    check_heldout_apart(cfg)
    check_search_mode(cfg)
    if not dry_run or is_ours(cfg.student) or looks_like_path(cfg.student):
        plan.start  # noqa: B018 (resolved here, where a refusal is one line before any launch)
    if not dry_run:
        plan.questions  # noqa: B018
        open_backend(cfg.wiki)
        return
    if cfg.wiki.backend == "local" and Path(cfg.wiki.index).exists():
        from pipeline.wiki.index import LocalIndex

        LocalIndex(Path(cfg.wiki.index))  # opened read-only: a folder or a broken index is refused
