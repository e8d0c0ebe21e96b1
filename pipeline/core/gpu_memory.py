"""Free GPU memory before a unit starts. A teacher left running (`vllm serve` holds 90% of every
GPU) makes the next training die minutes in with a CUDA out-of-memory traceback, and the next
in-process vLLM engine refuse at start-up; `run` checks each train / eval unit's need when the
unit starts (the memory held changes between units) and stops in one line that names what holds
the memory.

Where the numbers come from: `nvidia-smi --query-gpu` (each GPU's total and free memory) and
`nvidia-smi --query-compute-apps` (which process holds how much, named by its command line where
/proc shows it). Without nvidia-smi but with CUDA: torch.cuda.mem_get_info, in a short child
process so that this long-lived process never holds a CUDA context (itself ~0.5 GB per GPU)
while the units run. Without GPUs there is nothing to check.

A unit's need (`GpuNeed`): the first `gpus` of the GPUs it sees (CUDA_VISIBLE_DEVICES), each with
`share` of its memory free (vLLM's own start-up rule: free >= gpu_memory_utilization x total), or
`mib` free on the first (a transformers model's weights).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.devices import gpu_count
from pipeline.core.errors import PipelineError

# A training launch was sized (the student configs' headers) for GPUs it has to itself, and its
# peak (activations, the allocator's cache, NCCL buffers) is above the steady state: ask that
# nobody else hold more than 10% of each (an idle GPU shows well under 1%: the driver's own).
TRAIN_SHARE = 0.9
GPU_QUERY = ["--query-gpu=index,uuid,memory.total,memory.free", "--format=csv,noheader,nounits"]
APPS_QUERY = ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"]
MEM_GET_INFO = ("import json, torch; print(json.dumps([torch.cuda.mem_get_info(i) "
                "for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []))")


@dataclass(frozen=True)
class GpuNeed:
    what: str  # e.g. "training llama-3.1-8b on react"
    gpus: int  # the first `gpus` GPUs the unit sees
    share: float | None = None  # of each GPU's memory, free
    mib: int | None = None  # or this much free on each
    why: str = ""
    devices: str | None = None  # the unit's own CUDA_VISIBLE_DEVICES (a server's env), else the process's


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    total_mib: int
    free_mib: int


@dataclass(frozen=True)
class App:
    gpu_uuid: str
    pid: int
    name: str
    used_mib: int | None  # None: nvidia-smi cannot say (e.g. "[N/A]" inside some containers)


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_gpus(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,uuid,memory.total,memory.free --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and None not in (index := _int(fields[0]), total := _int(fields[2]), free := _int(fields[3])):
            gpus.append(Gpu(index, fields[1], total, free))
    return gpus


def parse_apps(text: str) -> list[App]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory ...` (a name may hold commas)."""
    apps = []
    for line in text.splitlines():
        head = line.split(",", 2)
        if len(head) == 3 and (pid := _int(head[1])) is not None and "," in head[2]:
            name, used = head[2].rsplit(",", 1)
            apps.append(App(head[0].strip(), pid, name.strip(), _int(used)))
    return apps


def query_nvidia_smi() -> tuple[list[Gpu], list[App]] | None:
    """Every GPU and every compute process nvidia-smi sees; None without a working nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        gpus = subprocess.run([smi, *GPU_QUERY], capture_output=True, text=True, timeout=30, check=True).stdout
        apps = subprocess.run([smi, *APPS_QUERY], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None  # installed but not working (no driver): the torch path below decides
    return parse_gpus(gpus), parse_apps(apps)


def query_torch(devices: str | None) -> list[Gpu]:
    """(free, total) of each GPU the unit sees, from torch in a child process: [] without CUDA."""
    env = dict(os.environ) if devices is None else {**os.environ, "CUDA_VISIBLE_DEVICES": devices}
    try:
        out = subprocess.run([sys.executable, "-c", MEM_GET_INFO], capture_output=True, text=True,
                             timeout=300, env=env, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [Gpu(i, "", total >> 20, free >> 20) for i, (free, total) in enumerate(json.loads(out or "[]"))]


def visible(gpus: list[Gpu], devices: str | None) -> list[Gpu] | None:
    """The GPUs a process sees, in CUDA's order: all, or those CUDA_VISIBLE_DEVICES names by index
    or UUID (prefix); None where it names one nvidia-smi does not list (e.g. a MIG slice)."""
    if devices is None:
        return sorted(gpus, key=lambda g: g.index)
    seen = []
    for entry in (e.strip() for e in devices.split(",") if e.strip()):
        match = [g for g in gpus if (str(g.index) == entry if entry.isdigit() else g.uuid.startswith(entry))]
        if not match:
            return None
        seen.append(match[0])
    return seen


def command_line(pid: int, fallback: str) -> str:
    """What a process is, for a person: its command line where /proc shows it, else nvidia-smi's name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return fallback or "?"
    text = " ".join(a.decode("utf-8", "replace") for a in argv if a)
    return (text[:100] + " ...") if len(text) > 100 else text or fallback or "?"


def gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def span(indices: list[int]) -> str:
    return str(indices[0]) if len(indices) == 1 else (
        f"{indices[0]}-{indices[-1]}" if indices == list(range(indices[0], indices[-1] + 1)) else ",".join(map(str, indices)))


def shortfall(need: GpuNeed, gpus: list[Gpu], apps: list[App] | None) -> str | None:
    """The one line saying why `need` cannot start on these GPUs (what the unit sees, in order),
    naming the processes that hold their memory; None when it can. `apps` None: unknown."""
    use = gpus[:need.gpus]
    if len(use) < need.gpus:
        return (f"{need.what} needs {need.gpus} GPU(s) and sees {len(gpus)}; set its tensor_parallel_size / "
                "num_processes to fit, or free CUDA_VISIBLE_DEVICES")
    wanted = {g.index: int(need.share * g.total_mib) if need.share is not None else (need.mib or 0) for g in use}
    short = [g for g in use if g.free_mib < wanted[g.index]]
    if not short:
        return None
    first = short[0]
    amount = f"{need.share:.0%} of each GPU's memory" if need.share is not None else f"{gib(need.mib or 0)} GiB"
    line = (f"{need.what} needs {amount} free on GPU {span([g.index for g in use])}" + (f" ({need.why})" if need.why else "")
            + f"; GPU {first.index} has {gib(first.free_mib)} of {gib(first.total_mib)} GiB free"
            + (f", and {len(short) - 1} more GPU(s) are short" if len(short) > 1 else ""))
    return line + "; " + holders(short, apps)


def holders(short: list[Gpu], apps: list[App] | None) -> str:
    """Who holds the memory of the short GPUs, biggest first, and what to do."""
    if apps is None:
        return "install nvidia-smi to see which processes hold it; stop them or wait, then re-run (finished units are skipped)"
    by_uuid = {g.uuid: g.index for g in short}
    held: dict[int, tuple[str, int, list[int]]] = {}
    for app in apps:
        if app.gpu_uuid in by_uuid:
            name, used, where = held.get(app.pid, (command_line(app.pid, app.name), 0, []))
            held[app.pid] = (name, used + (app.used_mib or 0), sorted([*where, by_uuid[app.gpu_uuid]]))
    if not held:
        return ("nvidia-smi lists no process on it (another container or user holds it?); free it or wait, "
                "then re-run (finished units are skipped)")
    ranked = sorted(held.items(), key=lambda item: -item[1][1])
    named = [f"pid {pid} `{name}` ({gib(used)} GiB on GPU {span(where)})" for pid, (name, used, where) in ranked[:3]]
    more = f" and {len(ranked) - 3} more" if len(ranked) > 3 else ""
    pids = " ".join(str(pid) for pid, _ in ranked)
    return (f"held by {', '.join(named)}{more}: stop it (kill {pids}) or wait for it to end, then re-run "
            "(finished units are skipped)")


KILL_ADVICE = re.compile(r"stop it \(kill ([\d ]+)\) or wait for it to end, then re-run")


def advised_pids(message: str) -> set[int]:
    """The processes a failed check's line advises killing that are running now."""
    found = KILL_ADVICE.search(message)
    return {int(p) for p in found.group(1).split() if is_running(int(p))} if found else set()


def advice_now(message: str, running_then: set[int]) -> str:
    """A failed check's line re-read once its `run` has stopped its own servers (a unit beside a
    shared server it could not use found that server holding the GPU): of the processes it
    advised killing, those running at the failure (`running_then`: advised_pids) and ended since
    are not advised killed any more; the line as it was when none has ended."""
    found = KILL_ADVICE.search(message)
    if not found:
        return message
    pids = [int(p) for p in found.group(1).split()]
    alive = [p for p in pids if p not in running_then or is_running(p)]
    if alive == pids:
        return message
    ended = f"{len(pids) - len(alive)} of them ended since (this run stopped its own server)"
    now = (f"stop the rest (kill {' '.join(map(str, alive))}; {ended}) or wait for them to end, then re-run" if alive
           else "all of them ended since (this run stopped its own server on the failure): re-run")
    return message[:found.start()] + now + message[found.end():]


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def check(need: GpuNeed | None) -> None:
    """Raise PipelineError (one line) when the GPUs `need` names lack the free memory; nothing
    without a need or without GPUs."""
    if need is None or need.gpus < 1:
        return
    devices = need.devices if need.devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    found = query_nvidia_smi()
    if found is not None and found[0]:
        gpus, apps = found
        seen = visible(gpus, devices)
        if seen is None:
            print(f"[gpu] {need.what}: not checking free memory: CUDA_VISIBLE_DEVICES={devices} names a device "
                  "nvidia-smi does not list (a MIG slice?)", flush=True)
            return
    else:
        if not gpu_count():  # asks the driver for a count: no context, no memory
            return  # no GPU here
        seen, apps = query_torch(devices), None
    line = shortfall(need, seen, apps)
    if line:
        raise PipelineError(line)
    amount = f"{need.share:.0%} of each GPU's memory" if need.share is not None else f"{gib(need.mib or 0)} GiB"
    print(f"[gpu] {need.what}: {amount} free on GPU {span([g.index for g in seen[:need.gpus]])}: ok", flush=True)


def training_need(what: str, processes: int) -> GpuNeed:
    """A training launch on GPUs: one process per GPU, each GPU to itself."""
    return GpuNeed(what, processes, share=TRAIN_SHARE, why="a training launch expects its GPUs to itself")


def llm_need(what: str, llm, serve=None, params_b: float | None = None) -> GpuNeed | None:
    """The GPUs an LLM section loads its model on: vLLM (in-process, or a `vllm serve` the unit
    starts) its tensor_parallel_size GPUs at gpu_memory_utilization each; transformers on CUDA its
    16-bit (or fp32) weights on one GPU, where the size is known; a remote server or a stand-in: none."""
    if llm.backend == "vllm" or serve is not None:
        devices = (serve.env or {}).get("CUDA_VISIBLE_DEVICES") if serve is not None else None
        return GpuNeed(what, llm.tensor_parallel_size, share=llm.gpu_memory_utilization,
                       why="vLLM starts only with gpu_memory_utilization of each GPU free", devices=devices)
    if llm.backend == "transformers" and llm.device != "cpu" and params_b:
        width = 4 if llm.dtype == "float32" else 2
        return GpuNeed(what, 1, mib=int(params_b * 1e9 * width / 2**20), why=f"its weights, {width} bytes per parameter")
    return None
