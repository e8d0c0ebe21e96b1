"""Launching a training script under `accelerate launch`: the shipped accelerate configs, the
process count, several machines, and relaying the child's one error line. Shared by the `train`
and `grpo` stages (each launches its own module with its own resolved config).

    cmd = launch_command(pick_accelerate_config("cpu_ddp", gpus=0), 2, Path("out/finetune_config.yaml"), precision="fp32")
    launch(cmd)      # streams the output; the child's error line becomes a PipelineError

`accelerate_config` is a name under accelerate_configs/ (cpu, cpu_ddp, single_gpu, multi_gpu,
deepspeed_zero2, deepspeed_zero3, deepspeed_zero3_offload, fsdp), a path to a YAML file, or
`auto`: no GPU -> cpu, one GPU -> single_gpu, several -> multi_gpu over all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.core.config import int_at_least, read_yaml, to_dict
from pipeline.core.devices import gpu_count
from pipeline.core.errors import PipelineError
from pipeline.core.folder_lock import run_lock
from pipeline.core.parent_death import ends_with_parent
from pipeline.core.relay import pieces
from pipeline.core.storage import atomic_write_text, is_done
from pipeline.train.deepspeed_setup import ACCELERATE_CONFIGS

FINETUNE_MODULE = "pipeline.finetune"
DEFAULT_PORT = 29500  # torch.distributed's default, as accelerate's
# `accelerate launch --mixed_precision` for each planned training precision (pipeline/core/precision.py).
# Passed on every launch: the GPU configs say bf16, accelerate exports the launch's value to the
# workers (ACCELERATE_MIXED_PRECISION), and TrainingArguments takes that value up whenever its own
# bf16 / fp16 are off (transformers' training_args.py, "Read from env first"), so an fp32 run on a
# GPU would train under bf16 autocast while its manifest and card say fp32.
MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
NODELIST_HINT = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """--accelerate-config, --num-processes, --dry-run and the several-machines group."""
    parser.add_argument("--accelerate-config", help="name under accelerate_configs/ or a YAML path (default: the config's accelerate_config)")
    parser.add_argument("--num-processes", type=int_at_least(1, "--num-processes"), help="override the accelerate config's process count")
    parser.add_argument("--dry-run", action="store_true", help="print the launch command and exit")
    machines = parser.add_argument_group("several machines (default: from SLURM and MASTER_ADDR/MASTER_PORT)")
    machines.add_argument("--num-machines", type=int_at_least(1, "--num-machines"), help="machines in this training run (SLURM_NNODES)")
    machines.add_argument("--machine-rank", type=int_at_least(0, "--machine-rank"), help="this machine's rank, 0 .. num-machines - 1 (SLURM_NODEID)")
    machines.add_argument("--main-process-ip", help="address of machine 0, reachable from all (MASTER_ADDR)")
    machines.add_argument("--main-process-port", type=int_at_least(1, "--main-process-port"), help=f"a free port on machine 0 (MASTER_PORT; default {DEFAULT_PORT})")


def machines_from_args(args: argparse.Namespace) -> Machines:
    return machines_from(count=args.num_machines, rank=args.machine_rank, main_ip=args.main_process_ip,
                         main_port=args.main_process_port)


@dataclass(frozen=True)
class Machines:
    """Where this launch sits in a multi-machine run (count 1: a single machine)."""

    count: int = 1
    rank: int = 0
    main_ip: str | None = None
    main_port: int = DEFAULT_PORT

    def launch_args(self) -> list[str]:
        if self.count == 1:
            # A free port of accelerate's choosing (0), not the fixed 29500: two launches on one
            # machine (a test on another worker, a second run) that both find 29500 free would
            # both bind it, and one fails with EADDRINUSE (exit 1).
            return ["--main_process_port", "0"]
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


@dataclass(frozen=True)
class World:
    """Where one launch runs: its accelerate config file, its processes on this machine and the
    GPUs it counted them from."""
    config: Path
    processes: int
    gpus: int


def launch_world(accelerate_config: str, num_processes: int | None, gpus: int | None = None) -> World:
    """The one answer to "what would this launch run as here?" for `train`, `grpo` and `run`'s
    plan and checks: `gpus` defaults to this machine's count (the rehearsal passes its target's)."""
    gpus = gpu_count() if gpus is None else gpus
    config = pick_accelerate_config(accelerate_config, gpus)
    return World(config, processes_for(config, num_processes, gpus), gpus)


def config_world(cfg) -> World:
    """Where a train or grpo config's launch (its accelerate_config, num_processes) runs on this machine."""
    return launch_world(cfg.accelerate_config, cfg.num_processes)


def launch_command(config_path: Path, num_processes: int, resolved_config: Path, gpus: int = 0,
                   machines: Machines = Machines(), module: str = FINETUNE_MODULE, *, precision: str,
                   python: str = sys.executable) -> list[str]:
    """`accelerate launch ... -m <module> --config <resolved config>`; `num_processes` is this
    machine's, the launch gets every machine's (accelerate divides by num_machines). `precision`:
    the planned training precision (bf16 | fp16 | fp32), said to accelerate on every launch;
    `python`: the interpreter the launch runs in (the vLLM environment for vLLM rollouts)."""
    if precision not in MIXED_PRECISION:
        raise PipelineError(f"launch: unknown training precision {precision!r}; one of {', '.join(MIXED_PRECISION)}")
    cmd = [str(python), "-m", "accelerate.commands.launch", "--config_file", str(config_path),
           "--num_processes", str(num_processes * machines.count), *machines.launch_args(),
           "--mixed_precision", MIXED_PRECISION[precision]]
    data = read_yaml(config_path)
    if num_processes * machines.count > 1 and data.get("distributed_type") == "NO":
        raise PipelineError(f"{config_path} runs one process; pick cpu_ddp / multi_gpu / deepspeed_* for "
                            f"{num_processes * machines.count}")
    launcher = (data.get("deepspeed_config") or {}).get("deepspeed_multinode_launcher")
    if machines.count > 1 and data.get("distributed_type") == "DEEPSPEED" and launcher != "standard":
        # accelerate's other DeepSpeed launchers (pdsh, ...) start every node from machine 0 over ssh
        raise PipelineError(f"{config_path}: several machines need deepspeed_multinode_launcher: standard "
                            "(each machine runs its own launch); set it in the file")
    return cmd + ["-m", module, "--config", str(resolved_config)]


def write_config_file(cfg, path: Path, dry_run: bool, label: str) -> Path:
    """`cfg` as YAML at `path` (what the launched processes read, and a record of what the run was
    asked to do); a dry run prints it instead."""
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    if dry_run:
        print(f"[{label}] dry run: would write {path}:\n{text}", end="")
    else:
        atomic_write_text(path, text)
    return path


def holding_output(output_dir: str | Path, machines: Machines, dry_run: bool) -> contextlib.AbstractContextManager:
    """Hold the output folder for the launch (pipeline.core.folder_lock): a second launch into it
    would set the first's in-progress checkpoint aside as incomplete and restart from step 0. The
    launching process holds it, so the OS lets it go when the launch ends, however it ends. Only
    machine 0 holds it (the other machines of one run write into the same shared folder); a dry
    run writes nothing and holds nothing."""
    if dry_run or machines.rank != 0:
        return contextlib.nullcontext()
    return run_lock(Path(output_dir), key="output_dir")


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


def exit_after_save(code: int, final: Path, started: float, label: str) -> int:
    """The launch's exit code, unless `final` was saved complete by this launch (its manifest
    written after `started`, a time.time(), and complete: write_final writes it last and renames
    the folder into place once every rank has joined the save): then 0, with a line saying what
    the launch exited with. A rank can still abort after its work is saved, at the interpreter's
    teardown ("terminate called without an active exception"; docs/faults.md), and a finished
    run must not be reported failed for it (nor trained again: `run` skips a complete final/)."""
    manifest = final / "manifest.json"
    if code == 0 or not is_done(manifest) or manifest.stat().st_mtime < started:
        return code
    print(f"[{label}] the launch exited with code {code} after this launch saved {final} complete (a rank's exit "
          "after the saved run: docs/faults.md, the teardown abort); the run is done", flush=True)
    return 0


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
    # its own session (Ctrl-C here reaches it through signal_tree). Should this process be killed
    # outright, the launch gets SIGTERM, which accelerate and torchrun pass on to the workers: not
    # left to die at its next write into the broken pipe (measured: within 5 s of a tiny model's
    # steps, but a launch loading a 70B or saving its checkpoint writes nothing for minutes)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=ends_with_parent())
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
