"""The simulated node: the target's GPUs, reported by a STAND-IN `nvidia-smi` on PATH.

The stand-in answers the two queries pipeline/core/gpu_memory.py makes (each GPU's total and free
memory; each compute process and what it holds) for a node of `gpus` x `total_mib`, and derives
what each process holds from what the process is, as a real node would show it:
- a vLLM server (the rehearsal's cpu_serve.py keeps its GPU flags in REHEARSAL_GPUS): its
  gpu_memory_utilization of each of its tensor-parallel GPUs (the first ones it sees, after its
  CUDA_VISIBLE_DEVICES), as vLLM fills its share at start-up (v1/worker/utils.py, request_memory);
- a training rank (LOCAL_RANK set, running pipeline.finetune or the grpo trainer): TRAIN_SHARE of
  its own GPU, what a launch sized for the node (the student headers) fills;
- anything else: nothing.
It reads /proc and counts only this rehearsal's processes (REHEARSAL_NODE in their environment,
set by install() and inherited by every child), as a node shows only its own: another program on
the laptop (a test beside it, another rehearsal) holds nothing of this node. Every GPU check the
run makes goes through it, and the run prints each verdict (gpu_memory.check).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

GPUS = 8
TOTAL_MIB = 81559  # memory.total of an H100 80GB HBM3
IDLE_FREE_MIB = 81004  # memory.free of an idle one (the driver reserves the rest)
TRAIN_SHARE = 0.7
NODE_VARIABLE = "REHEARSAL_NODE"  # the node folder, in the environment of every process of the rehearsal
TRAINERS = ("pipeline.finetune", "pipeline/finetune.py", "pipeline.rl.train", "pipeline/rl/train.py")

# The stand-in itself: run by this interpreter, it imports this module from the project.
SCRIPT = """#!{python}
# STAND-IN nvidia-smi of the rehearsal's simulated node (pipeline/rehearsal/node.py)
import sys
sys.path.insert(0, {root!r})
from pipeline.rehearsal.node import answer
sys.exit(answer({folder!r}, sys.argv[1:]))
"""


def install(folder: Path, gpus: int = GPUS, total_mib: int = TOTAL_MIB) -> Path:
    """Write the stand-in into <folder>/bin and put it first on PATH for this process and its
    children; returns the bin folder."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (folder / "node.json").write_text(json.dumps({"gpus": gpus, "total_mib": total_mib,
                                                   "idle_free_mib": IDLE_FREE_MIB - (TOTAL_MIB - total_mib)}))
    smi = bin_dir / "nvidia-smi"
    root = str(Path(__file__).resolve().parents[2])
    smi.write_text(SCRIPT.format(python=sys.executable, root=root, folder=str(folder.resolve())))
    smi.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ[NODE_VARIABLE] = str(folder.resolve())
    return bin_dir


def uuid(index: int) -> str:
    return f"GPU-rehearsal-0000-0000-0000-0000000000{index:02d}"


def answer(folder: str, args: list[str]) -> int:
    """What nvidia-smi prints for the two queries gpu_memory.py makes; any other call fails."""
    from pipeline.core.gpu_memory import APPS_QUERY, GPU_QUERY

    node = json.loads((Path(folder) / "node.json").read_text())
    held = holdings(node, folder)
    if args == GPU_QUERY:
        for i in range(node["gpus"]):
            used = sum(mib for gpu, _, _, mib in held if gpu == i)
            print(f"{i}, {uuid(i)}, {node['total_mib']}, {max(0, node['idle_free_mib'] - used)}")
        return 0
    if args == APPS_QUERY:
        for gpu, pid, name, mib in held:
            print(f"{uuid(gpu)}, {pid}, {name}, {mib}")
        return 0
    # Any other caller (accelerate's launcher asks for the GPU count) gets this CPU's truth: no GPU.
    print(f"stand-in nvidia-smi (the rehearsal's simulated node answers the run's GPU checks only): "
          f"{' '.join(args)}: no GPU here", file=sys.stderr)
    return 9


def holdings(node: dict, folder: str) -> list[tuple[int, int, str, int]]:
    """(GPU index, pid, process name, MiB) of every process of this rehearsal (its node `folder`)
    holding GPU memory on the node."""
    procs = {pid: info for pid in os.listdir("/proc") if pid.isdigit() and (info := process(int(pid)))
             and info[0].get(NODE_VARIABLE) == folder}
    held = []
    for pid, (env, argv, parent) in procs.items():
        if "REHEARSAL_GPUS" in env and "REHEARSAL_GPUS" not in procs.get(str(parent), ({}, [], 0))[0]:
            flags = dict(kv.split("=", 1) for kv in env["REHEARSAL_GPUS"].split(",") if "=" in kv)
            tp = int(flags.get("tensor-parallel-size", 1))
            share = float(flags.get("gpu-memory-utilization", 0.9))
            for gpu in devices(env, node["gpus"])[:tp]:
                held.append((gpu, int(pid), "VLLM::Worker", int(share * node["total_mib"])))
        elif "LOCAL_RANK" in env and any(t in " ".join(argv) for t in TRAINERS):
            gpu = devices(env, node["gpus"])[int(env["LOCAL_RANK"]) % node["gpus"]]
            held.append((gpu, int(pid), "python", int(TRAIN_SHARE * node["total_mib"])))
    return sorted(held)


def devices(env: dict, count: int) -> list[int]:
    """The node's GPUs a process sees, in CUDA's order."""
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return list(range(count))
    return [int(d) for d in given.split(",") if d.strip().isdigit() and int(d) < count]


def process(pid: int) -> tuple[dict, list[str], int] | None:
    """(environment, argv, parent pid) of a process this user may read; None otherwise."""
    try:
        raw_env = Path(f"/proc/{pid}/environ").read_bytes()
        argv = [a.decode("utf-8", "replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    env = dict(kv.decode("utf-8", "replace").split("=", 1) for kv in raw_env.split(b"\0") if b"=" in kv)
    parent = int(stat.rsplit(")", 1)[1].split()[1])
    return env, argv, parent
