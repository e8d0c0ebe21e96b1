"""Checks around a training launch: is a checkpoint complete (under every strategy), may a run
resume on this launch's layout, can this config work here at all. Each check fails in one line.

Called from pipeline/train/run.py at three points: config time (`check_config`, before any model
is loaded), checkpoint choice (`is_complete_checkpoint`; `incomplete_reason` says what a torn one
lacks), and resume (`check_resume_layout`).

What each strategy writes into checkpoint-N/ (transformers' Trainer._save_checkpoint, accelerate's
fsdp_utils, DeepSpeed's engine.save_checkpoint); trainer_state.json is always written last:

    plain / DDP   model.safetensors (or adapter_model.safetensors), optimizer.pt, scheduler.pt
    ZeRO-2 / -3   latest -> global_stepN/ holding one optimizer shard per data-parallel rank,
                  [bf16_]zero_pp_rank_{r}_mp_rank_00_optim_states.pt ("bf16_" when DeepSpeed runs
                  bf16), and the model states: ZeRO-2 one mp_rank_00_model_states.pt, ZeRO-3 one
                  zero_pp_rank_{r}_mp_rank_00_model_states.pt per rank (engine.py _get_ckpt_name,
                  _get_rank_zero_ckpt_name); model.safetensors only where 16-bit weights are
                  gathered on save. Rank 0 writes `latest` after its OWN files only (the other
                  ranks' may still be in flight); the Trainer writes trainer_state.json after
                  DeepSpeed's closing barrier, and a resume loads every rank's shard, so a
                  checkpoint must hold one per rank of the world size recorded with it (Layout)
    FSDP          pytorch_model_fsdp.bin + optimizer.bin (FULL_STATE_DICT) or the folders
                  pytorch_model_fsdp_0/ + optimizer_0/ (SHARDED_STATE_DICT, torch.distributed.checkpoint,
                  whose .metadata is written last), or per-rank *_rank{i}.bin files
    LoRA          the same optimizer state; the weights are adapter_model.safetensors
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.core import devices
from pipeline.core.errors import PipelineError
from pipeline.train.launch import Launch

CHECKPOINT_PREFIX = "checkpoint-"
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")
FSDP_MODEL_NAME = "pytorch_model_fsdp"  # accelerate.utils.constants.FSDP_MODEL_NAME
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint writes it after every rank's shard


# ----------------------------------------------------------------------------- strategy

def optimizer_is_sharded(strategy: str) -> bool:
    """Whether the optimizer state on disk is split by rank (so a resume needs the same count)."""
    return strategy.startswith("zero") or strategy == "fsdp"


# ----------------------------------------------------------------------------- checkpoints

def checkpoint_step(path: Path) -> int:
    suffix = path.name[len(CHECKPOINT_PREFIX):]
    return int(suffix) if path.name.startswith(CHECKPOINT_PREFIX) and suffix.isdigit() else -1


def read_trainer_state(path: Path) -> dict | None:
    try:
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return state if isinstance(state, dict) else None


def is_complete_checkpoint(path: Path) -> bool:
    return incomplete_reason(path) is None


def incomplete_reason(path: Path) -> str | None:
    """Why `path` is not a usable checkpoint, or None when it is: the trainer finished writing it
    (trainer_state.json is written last, and must parse, for this folder's step), and the weights
    and the optimizer state of whichever strategy wrote it are there."""
    state = read_trainer_state(path)
    if state is None or not isinstance(state.get("global_step"), int):
        return "no readable trainer_state.json (the trainer writes it last)"
    if path.name != f"{CHECKPOINT_PREFIX}{state['global_step']}":
        return f"its trainer_state.json is for step {state['global_step']}"
    if (path / "latest").is_file():  # DeepSpeed's: a resume loads its states, nothing else
        return deepspeed_gap(path, saved_layout(path))
    if not (any((path / name).is_file() for name in HF_WEIGHT_FILES) or fsdp_model_state(path)):
        return "no model weights"
    if not ((path / "optimizer.pt").is_file() or fsdp_optimizer_state(path)):
        return "no optimizer state"
    return None


# engine.py: f"{'bf16_' if bf16 else ''}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt" and, under
# ZeRO-3, f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt" per rank
DEEPSPEED_SHARD = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_(optim|model)_states\.pt")


def deepspeed_gap(path: Path, layout: Layout | None) -> str | None:
    """What a DeepSpeed checkpoint lacks for a resume, or None. `layout` (saved with the trainer
    state) gives the number of processes that wrote it: one optimizer shard each (this project
    runs DeepSpeed data-parallel only, so data-parallel ranks = processes), and under ZeRO-3
    one model-state shard each. A checkpoint from before layouts were saved is checked for gaps.
    (DeepSpeed records the number too, as dp_world_size inside its pickled model states, and
    refuses another on load; but under ZeRO-2 that file holds the whole module, 16 GB for the 8B,
    and unpickling it is no check to run on every checkpoint folder.)"""
    tag = (path / "latest").read_text(encoding="utf-8").strip()
    folder = path / tag
    if not tag or not folder.is_dir():
        return f"`latest` names {tag!r}, which is not a folder in it"
    ranks: dict[str, set[int]] = {"optim": set(), "model": set()}
    for file in folder.iterdir():
        match = DEEPSPEED_SHARD.fullmatch(file.name)
        if match:
            ranks[match[2]].add(int(match[1]))
    if not ranks["optim"]:
        return f"{tag}/ holds no ZeRO optimizer states"
    zero3 = layout.strategy == "zero3" if layout else bool(ranks["model"])
    if not zero3 and not any(folder.glob("mp_rank_*_model_states.pt")):
        return f"{tag}/ holds no model states (mp_rank_00_model_states.pt)"
    world = layout.num_processes if layout else max(ranks["optim"]) + 1
    for kind in ("optim", "model") if zero3 else ("optim",):
        missing = sorted(set(range(world)) - ranks[kind])
        if missing:
            return (f"{tag}/ holds the {kind}_states.pt of {world - len(missing)} of the {world} ranks that wrote it "
                    f"(missing rank {spans(missing)}): each rank writes its own shard, so with several nodes "
                    "output_root must be one filesystem that all of them write to")
    return None


def spans(numbers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8": rank lists of a 64-GPU run stay short."""
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(out)


def _dcp_dir(path: Path) -> bool:
    return path.is_dir() and (path / DCP_METADATA).is_file()


def fsdp_model_state(path: Path) -> bool:
    return (any(path.glob(f"{FSDP_MODEL_NAME}*.bin"))
            or any(_dcp_dir(p) for p in path.glob(f"{FSDP_MODEL_NAME}_*")))


def fsdp_optimizer_state(path: Path) -> bool:
    # optimizer.bin / optimizer_1.bin (full), optimizer_0_rank0.bin (per rank), optimizer_0/ (DCP)
    return any(path.glob("optimizer*.bin")) or any(_dcp_dir(p) for p in path.glob("optimizer_*"))


# ----------------------------------------------------------------------------- resume layout

@dataclass(frozen=True)
class Layout:
    """How a launch splits the global batch. Saved inside every checkpoint's trainer_state.json
    (as a stateful callback, so it is written with the state, atomically) and compared on resume."""

    num_processes: int
    per_device_batch_size: int
    gradient_accumulation_steps: int
    global_batch_size: int
    strategy: str
    examples: int

    def describe(self) -> str:
        return (f"{self.global_batch_size} = {self.per_device_batch_size} per device x "
                f"{self.gradient_accumulation_steps} accumulation x {self.num_processes} processes ({self.strategy})")


LAYOUT_CALLBACK = "LaunchLayout"


def layout_callback(layout: Layout):
    """A TrainerCallback whose state (the layout) the Trainer writes into trainer_state.json."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState

    class LaunchLayout(TrainerCallback, ExportableState):
        def __init__(self, **fields):
            self.fields = fields

        def state(self) -> dict:
            return {"args": dict(self.fields), "attributes": {}}

    return LaunchLayout(**asdict(layout))


def saved_layout(checkpoint: Path) -> Layout | None:
    state = read_trainer_state(checkpoint) or {}
    saved = (state.get("stateful_callbacks") or {}).get(LAYOUT_CALLBACK)
    if isinstance(saved, list):
        saved = saved[-1] if saved else None
    try:
        return Layout(**saved["args"])
    except (TypeError, KeyError):
        return None


def check_resume_layout(checkpoint: Path, saved: Layout | None, now: Layout) -> str:
    """Refuse (PipelineError) a resume that would silently change what a step trains on; else
    return one line saying what happens.

    A different split of the same global batch trains on the same examples per step only when
    each epoch cuts into the same batches: the sampler's order does not depend on the split
    (accelerate's seedable sampler), and consecutive micro-batches of per_device x processes
    tile each batch of `global` examples, except the epoch's last, partial one (examples mod
    global), which must split evenly under both layouts (no wrap-around padding, no short
    micro-batch). Sharded optimizer states (ZeRO, FSDP) also need the same process count."""
    if saved is None:
        return f"resuming from {checkpoint} (it records no batch layout: written before layouts were saved)"
    fix = f"relaunch with --num_processes {saved.num_processes} per_device_batch_size={saved.per_device_batch_size}, or resume=none to start over"
    if saved.global_batch_size != now.global_batch_size:
        raise PipelineError(f"resume: {checkpoint} was trained with global_batch_size={saved.global_batch_size}, "
                            f"this launch has {now.global_batch_size}; set it back, or resume=none to start over")
    if saved.examples != now.examples:
        raise PipelineError(f"resume: {checkpoint} was trained on {saved.examples} examples, this launch has "
                            f"{now.examples} (the data changed, so the data order would too); restore the dataset "
                            "(or max_examples/max_length), or resume=none to start over")
    if saved.strategy != now.strategy and (optimizer_is_sharded(saved.strategy) or optimizer_is_sharded(now.strategy)):
        raise PipelineError(f"resume: {checkpoint} was written under {saved.strategy}, this launch runs {now.strategy}; "
                            f"their optimizer states are not interchangeable: relaunch with the {saved.strategy} "
                            "accelerate config, or resume=none to start over")
    same = (saved.num_processes, saved.per_device_batch_size) == (now.num_processes, now.per_device_batch_size)
    if same:
        return f"resuming from {checkpoint}"
    if saved.num_processes != now.num_processes and optimizer_is_sharded(now.strategy):
        raise PipelineError(f"resume: {checkpoint} holds {now.strategy} optimizer state split over "
                            f"{saved.num_processes} processes; this launch has {now.num_processes}: {fix}")
    tail = now.examples % now.global_batch_size
    cuts = [layout.per_device_batch_size * layout.num_processes for layout in (saved, now)]
    if any(tail % cut for cut in cuts):
        raise PipelineError(
            f"resume: {checkpoint} was trained with batch {saved.describe()}; this launch would use {now.describe()}, "
            f"and the last {tail} examples of each epoch would be cut into different batches (steps would change): "
            f"{fix} (a re-split keeps the steps when examples mod {now.global_batch_size} is a multiple of "
            "per_device x processes under both)")
    return (f"resuming from {checkpoint}, re-split: batch {now.describe()} (was {saved.describe()}); "
            f"the same {now.global_batch_size} examples per step, in the same order")


# ----------------------------------------------------------------------------- config time

def is_8bit_optimizer(optim: str) -> bool:
    return "8bit" in optim or optim.startswith(("adamw_bnb", "paged_", "lion_8bit", "ademamix_8bit"))


def check_config(finetuning: str, optim: str, strategy: str, cuda: bool, bitsandbytes: bool) -> None:
    """Refuse, in one line and before any model is loaded, a combination that cannot work here."""
    if finetuning == "qlora" and not cuda:
        raise PipelineError("finetuning: qlora needs a CUDA GPU (bitsandbytes' 4-bit kernels); use finetuning=lora on this machine")
    if finetuning == "qlora" and not bitsandbytes:
        raise PipelineError("finetuning: qlora needs bitsandbytes (pip install bitsandbytes), or use finetuning=lora")
    if is_8bit_optimizer(optim) and not bitsandbytes:
        raise PipelineError(f"optim: {optim} needs bitsandbytes (pip install bitsandbytes), or use optim=adamw_torch")
    if strategy == "fsdp" and not cuda:
        # accelerate (state.py) enables FSDP only for GPU-like process groups; a CPU launch would
        # silently train plain DDP, replicating everything FSDP was meant to shard.
        raise PipelineError("the accelerate config says FSDP, which accelerate runs on GPUs only (on CPU it would "
                            "silently run DDP); use accelerate_config=cpu_ddp or deepspeed_zero3 on this machine")
    if strategy == "fsdp" and is_8bit_optimizer(optim):
        # bitsandbytes' 8-bit optimizers quantise whole tensors and do not handle FSDP's
        # flat/DTensor shards (bitsandbytes issues #89, #1633)
        raise PipelineError(f"optim: {optim} (bitsandbytes 8-bit) does not work under FSDP; use optim=adamw_torch_fused "
                            "(FSDP already shards the optimizer state), or a deepspeed_* accelerate config")


def check_devices(launch: Launch, cuda_devices: int | None = None) -> None:
    """A launch that starts more processes on this node than it has GPUs fails (or hangs in
    NCCL) deep inside the first collective: say so first, on every rank, before any collective."""
    if cuda_devices is None:
        cuda_devices = devices.gpu_count()
    if cuda_devices == 0 or launch.use_cpu:
        return  # a CPU launch: processes are not tied to devices
    local = launch.local_world_size
    if local > cuda_devices:
        raise PipelineError(f"this launch starts {local} processes on this node, which has {cuda_devices} GPU(s); "
                            f"pass --num_processes {cuda_devices} to accelerate launch (or use `python -m pipeline train`, "
                            "which counts the GPUs)")
