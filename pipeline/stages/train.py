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

Before launching, what the child would refuse is checked here (dataset present and complete,
output folder writable, accelerate config readable, a DeepSpeed config with no GPU in sight
unless `deepspeed_on_cpu=true`). When the child stops on an error, its one
line and exit code are relayed, without the launcher's traceback.

Several machines (README, "Training on several nodes"): run `python -m pipeline train` once on
every machine (under SLURM: `srun --ntasks-per-node=1`, scripts/slurm/train.sbatch). The machine
count and this machine's rank come from --num-machines / --machine-rank, else from SLURM
(SLURM_STEP_NUM_NODES or SLURM_NNODES, SLURM_NODEID); machine 0's address and port from
--main-process-ip / --main-process-port, else MASTER_ADDR / MASTER_PORT (default port 29500).
`num_processes` stays the processes on this machine; the launch gets the total
(`accelerate launch --num_processes` counts every machine's) and the batch is split over all.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.core.config import add_config_arguments, read_yaml, stage_config, to_dict
from pipeline.core.errors import PipelineError
from pipeline.core.relay import pieces
from pipeline.core.storage import atomic_write_text
from pipeline.train.config import FinetuneConfig, resolve
from pipeline.train.deepspeed_setup import ACCELERATE_CONFIGS, check_deepspeed_device
from pipeline.train.plan import foreseen

FINETUNE_MODULE = "pipeline.finetune"
RESOLVED_CONFIG = "finetune_config.yaml"  # the resolved config, beside the checkpoints


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FinetuneConfig)
    parser.add_argument("--accelerate-config", help="name under accelerate_configs/ or a YAML path (default: the config's accelerate_config)")
    parser.add_argument("--num-processes", type=int, help="override the accelerate config's process count")
    parser.add_argument("--dry-run", action="store_true", help="print the launch command and exit")
    machines = parser.add_argument_group("several machines (default: from SLURM and MASTER_ADDR/MASTER_PORT)")
    machines.add_argument("--num-machines", type=int, help="machines in this training run (SLURM_NNODES)")
    machines.add_argument("--machine-rank", type=int, help="this machine's rank, 0 .. num-machines - 1 (SLURM_NODEID)")
    machines.add_argument("--main-process-ip", help="address of machine 0, reachable from all (MASTER_ADDR)")
    machines.add_argument("--main-process-port", type=int, help=f"a free port on machine 0 (MASTER_PORT; default {DEFAULT_PORT})")


DEFAULT_PORT = 29500  # torch.distributed's default, as accelerate's
NODELIST_HINT = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'


@dataclass(frozen=True)
class Machines:
    """Where this launch sits in a multi-machine run (count 1: a single machine)."""

    count: int = 1
    rank: int = 0
    main_ip: str | None = None
    main_port: int = DEFAULT_PORT

    def launch_args(self) -> list[str]:
        if self.count == 1:
            return []
        return ["--num_machines", str(self.count), "--machine_rank", str(self.rank),
                "--main_process_ip", str(self.main_ip), "--main_process_port", str(self.main_port)]

    def describe(self) -> str:
        return f"machine {self.rank} of {self.count} (machine 0 at {self.main_ip}:{self.main_port})"


def machines_from(env: dict[str, str] | None = None, *, count: int | None = None, rank: int | None = None,
                  main_ip: str | None = None, main_port: int | None = None) -> Machines:
    """The multi-machine settings: the arguments given, else the launcher's environment (SLURM
    and MASTER_ADDR / MASTER_PORT), else one machine. A one-line error names what is missing."""
    env = os.environ if env is None else env

    def number(value, names: tuple[str, ...], default: int) -> int:
        if value is not None:
            return value
        for name in names:
            raw = env.get(name, "").strip()
            if raw:
                if not raw.isdigit():
                    raise PipelineError(f"${name}={raw!r} is not a whole number")
                return int(raw)
        return default

    # a job step's own node count first: the allocation's may be larger than the step's
    count = number(count, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"), 1)
    if count == 1:
        return Machines()
    rank = number(rank, ("SLURM_NODEID",), -1)
    port = number(main_port, ("MASTER_PORT",), DEFAULT_PORT)
    main_ip = main_ip or env.get("MASTER_ADDR", "").strip() or None
    if count < 1:
        raise PipelineError(f"num_machines must be >= 1, got {count}")
    if not 0 <= rank < count:
        given = "not given" if rank == -1 else str(rank)
        raise PipelineError(f"machine rank {given}: with {count} machines each needs its rank 0 .. {count - 1} "
                            "(--machine-rank, or $SLURM_NODEID under srun)")
    if not main_ip:
        raise PipelineError(f"{count} machines but no address for machine 0: pass --main-process-ip or set "
                            f"MASTER_ADDR (under SLURM: {NODELIST_HINT})")
    if not 0 < port < 65536:
        raise PipelineError(f"main process port {port} is not a TCP port (1-65535)")
    return Machines(count, rank, main_ip, port)


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pick_accelerate_config(name: str, gpus: int) -> Path:
    if name == "auto":
        name = "cpu" if gpus == 0 else "single_gpu" if gpus == 1 else "multi_gpu"
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = ACCELERATE_CONFIGS / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in ACCELERATE_CONFIGS.glob("*.yaml")))
        raise PipelineError(f"accelerate_config: '{name}' not found ({path}); use auto, a path, or one of: {known}")
    return path


def processes_for(config_path: Path, override: int | None, gpus: int) -> int:
    data = read_yaml(config_path)
    per_gpu = data.get("distributed_type") in ("MULTI_GPU", "DEEPSPEED", "FSDP") and not data.get("use_cpu")
    if override is not None:
        if per_gpu and 0 < gpus < override:  # one process per GPU: more would fail (or hang) at start
            raise PipelineError(f"num_processes={override} but this node has {gpus} GPU(s); use at most {gpus} "
                                "(or leave num_processes unset: it defaults to the node's GPU count)")
        return override
    if per_gpu and gpus >= 1:
        return gpus  # a node's GPUs, whatever count the file was written for
    return int(data.get("num_processes", 1))


def launch_command(config_path: Path, num_processes: int, resolved_config: Path, gpus: int = 0,
                   machines: Machines = Machines()) -> list[str]:
    """`accelerate launch ... -m pipeline.finetune --config <resolved config>`; `num_processes`
    is this machine's, the launch gets every machine's (accelerate divides by num_machines)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_path),
           "--num_processes", str(num_processes * machines.count), *machines.launch_args()]
    if gpus == 0:  # the GPU configs ask for bf16; on CPU the script decides (pipeline/core/precision.py)
        cmd += ["--mixed_precision", "no"]
    data = read_yaml(config_path)
    if num_processes * machines.count > 1 and data.get("distributed_type") == "NO":
        raise PipelineError(f"{config_path} runs one process; pick cpu_ddp / multi_gpu / deepspeed_* for "
                            f"{num_processes * machines.count}")
    launcher = (data.get("deepspeed_config") or {}).get("deepspeed_multinode_launcher")
    if machines.count > 1 and data.get("distributed_type") == "DEEPSPEED" and launcher != "standard":
        # accelerate's other DeepSpeed launchers (pdsh, ...) start every node from machine 0 over ssh
        raise PipelineError(f"{config_path}: several machines need deepspeed_multinode_launcher: standard "
                            "(each machine runs its own launch); set it in the file")
    return cmd + ["-m", FINETUNE_MODULE, "--config", str(resolved_config)]


def write_resolved_config(cfg: FinetuneConfig, dry_run: bool = False) -> Path:
    """The resolved config as YAML in <output_dir>: what the launched processes read, and a
    record of what this run was asked to do. A dry run prints it instead of writing it."""
    path = Path(cfg.output_dir) / RESOLVED_CONFIG
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    if dry_run:
        print(f"[train] dry run: would write {path}:\n{text}", end="")
    else:
        atomic_write_text(path, text)
    return path


def main(args: argparse.Namespace) -> int:
    cfg = stage_config(FinetuneConfig, args, section="train", finish=resolve)
    machines = machines_from(count=args.num_machines, rank=args.machine_rank, main_ip=args.main_process_ip,
                             main_port=args.main_process_port)
    return train(cfg, accelerate_config=args.accelerate_config, num_processes=args.num_processes,
                 dry_run=args.dry_run, machines=machines)


def train(cfg: FinetuneConfig, *, accelerate_config: str | None = None, num_processes: int | None = None,
          dry_run: bool = False, machines: Machines | None = None) -> int:
    """Launch pipeline.finetune under accelerate with the resolved `cfg`; return the exit code.
    `run` calls this for each student x format. `machines`: default from the environment."""
    machines = machines_from() if machines is None else machines
    gpus = gpu_count()
    config_path = pick_accelerate_config(accelerate_config or cfg.accelerate_config, gpus)
    num_processes = processes_for(config_path, num_processes or cfg.num_processes, gpus)
    world = num_processes * machines.count
    accelerate = read_yaml(config_path)
    deepspeed = accelerate.get("distributed_type") == "DEEPSPEED"
    check_deepspeed_device(deepspeed, gpus > 0, cfg.deepspeed_on_cpu, world)  # before 8 CPU processes start
    per_device, accum, _ = foreseen(cfg, accelerate, world, gpus).batch
    if not dry_run:
        preflight(cfg, config_path)  # before the resolved config is written into output_dir
    cmd = launch_command(config_path, num_processes, write_resolved_config(cfg, dry_run), gpus, machines)
    where = "" if machines.count == 1 else f" ({num_processes} here, {machines.describe()})"
    print(f"[train] {cfg.format} / {cfg.student_name}: batch {cfg.global_batch_size} = {per_device} x {accum} "
          f"accumulation x {world} processes{where}, {cfg.max_steps} steps -> {cfg.output_dir}")
    print("[train] " + shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    return launch(cmd)


def preflight(cfg, config_path: Path) -> None:
    """Refuse now what the launched child would refuse seconds or minutes later: a dataset that
    is missing or incomplete by its manifest, an output folder that cannot be written, an
    accelerate config that is not a readable YAML file."""
    from pipeline.core.storage import check_writable_dir
    from pipeline.train.data import check_dataset

    read_yaml(config_path)
    check_dataset(cfg)
    check_writable_dir(cfg.output_dir, "output_dir")


def launch(cmd: list[str]) -> int:
    """Run the launch; when the child stops on a user error (it writes the line to an error
    file instead of stderr), raise that line with its exit code instead of showing the
    launcher's traceback (accelerate's CalledProcessError, torchrun's ChildFailedError)."""
    import json
    import tempfile

    from pipeline.train.failures import ERROR_FILE_ENV

    with tempfile.TemporaryDirectory(prefix="pipeline-train-") as folder:
        error_file = Path(folder) / "error.json"
        code, held = stream(cmd, {ERROR_FILE_ENV: str(error_file)})
        if code != 0 and error_file.is_file():
            error = json.loads(error_file.read_text(encoding="utf-8"))
            failure = PipelineError(error["message"])
            failure.exit_code = int(error.get("exit_code", code))
            raise failure
    for line in held:  # no error line from the child: a crash; show everything
        sys.stdout.write(line)
    return code


# Where the launcher's own report of a failed child begins: a Python traceback, or a
# torch.distributed.elastic error log line (glog style: "E1201 01:56:59.900000 10849 path:line] ...")
# or its warning that it is stopping the other workers.
_GLOG = r"\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\] "
LAUNCHER_REPORT = re.compile(rf"^(Traceback \(most recent call last\):|[EF]{_GLOG}|W{_GLOG}.*closing signal)")


def stream(cmd: list[str], extra_env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run the launch in its own process group, copying its output as it comes; Ctrl-C stops
    the whole group (the launcher and its workers), and the next run resumes from a checkpoint.
    From the first line of a launcher's failure report on, lines are held back and returned
    with the exit code, for the caller to show or drop."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    held: list[str] = []
    try:
        assert proc.stdout is not None
        for piece in pieces(proc.stdout.fileno()):  # a progress bar's \r redraw stays one
            line = piece.decode("utf-8", "replace")
            if held or LAUNCHER_REPORT.match(line):
                held.append(line)
                continue
            sys.stdout.write(line)
            sys.stdout.flush()
        return proc.wait(), held
    except KeyboardInterrupt:
        signal_tree(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            signal_tree(proc.pid, signal.SIGKILL)
        raise


def signal_tree(pid: int, sig: int) -> None:
    """Signal the launcher and every worker under it: torchrun starts its workers in their own
    process groups, so signalling the launcher's group alone would leave them training."""
    import psutil
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
