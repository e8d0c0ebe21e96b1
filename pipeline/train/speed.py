"""The choices that decide training speed on GPUs, as small pure functions (unit-tested on CPU):
attention implementation, loss path, FSDP's checkpointing and state-dict settings.

Each returns what it chose and one line saying why, which pipeline/finetune.py prints.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from pipeline.core import devices
from pipeline.core.errors import PipelineError
from pipeline.train.launch import Launch

FLASH = ("flash_attention_3", "flash_attention_2")


@dataclass(frozen=True)
class Kernels:
    """What is installed (and usable) on this machine."""

    cuda: bool
    hopper: bool = False  # compute capability 9.x: FlashAttention 3
    flash_attn_2: bool = False  # the flash_attn package
    flash_attn_3: bool = False  # flash_attn_interface (FlashAttention 3, Hopper)
    kernels_hub: bool = False  # transformers loads kernels-community/flash-attn2 through the `kernels` package
    kernels_hub_error: str | None = None  # why it cannot, where `kernels` is installed
    flash_attn_error: str | None = None  # a flash package that is installed but does not import, and why


def installed_kernels() -> Kernels:
    def found(name: str) -> bool:
        return importlib.util.find_spec(name) is not None
    if not devices.gpu_count():
        return kernels_on(False, 0, found)
    import torch
    return kernels_on(True, torch.cuda.get_device_capability()[0], found)


RANK0_KERNELS_KEY = "pipeline/kernels"  # in the launch's rendezvous store
_stores: list = []  # rank 0 keeps its store client open: its server (without torchrun's agent) lives with it


def launch_kernels(launch: Launch, env: Mapping[str, str]) -> Kernels:
    """Rank 0's installed_kernels(), for every rank of a launch. The attention kernel, and with it
    the per-device micro-batch and the accumulation (micro_batch_cap), follows what is usable, and
    the hub kernel's usability is a fetch (hub_flash_error): one that failed on some ranks only
    would give them another accumulation, and the run would hang in its collectives. So rank 0
    decides and the others read its answer from the launch's own rendezvous store (the one
    torch.distributed's env:// initialisation then uses: torchrun's agent store, else rank 0's),
    before any process group exists. A single process, or a launch without MASTER_ADDR (the
    launching process foreseeing the plan), decides for itself."""
    if launch.world_size == 1 or "MASTER_ADDR" not in env:
        return installed_kernels()
    from datetime import timedelta

    import torch.distributed as dist

    # the same store as env:// rendezvous, keyed per elastic restart (torchrun's agent store outlives one)
    store, _, _ = next(dist.rendezvous("env://", rank=launch.rank, world_size=launch.world_size,
                                       timeout=timedelta(minutes=30)))
    key = f"{RANK0_KERNELS_KEY}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if launch.rank0:
        kernels = installed_kernels()
        store.set(key, json.dumps(asdict(kernels)))
        _stores.append(store)
        return kernels
    return Kernels(**json.loads(store.get(key)))  # waits for rank 0's fetch


def kernels_on(cuda: bool, major: int, found: Callable[[str], bool],
               probe: Callable[[str], str | None] | None = None) -> Kernels:
    """The kernels usable with `cuda` and this compute capability, `found(package)` telling what
    is installed and `probe(package)` why an installed one does not import (None: it does;
    default import_error). A flash package counts only once it imports: one built for another
    torch or CUDA is found by find_spec and fails at its import, at model load, on every rank.
    The hub build is what `auto` falls back to when no flash package is installed (with a broken
    flash_attn installed, transformers takes that one, not the hub's); only then is it loaded now
    (hub_flash_error), so that a kernel that cannot be loaded turns `auto` into SDPA with the
    reason instead of failing at model load."""
    probe = import_error if probe is None else probe
    installed = [name for name in ("flash_attn", "flash_attn_interface") if cuda and found(name)]
    errors = {name: probe(name) for name in installed}
    fa2, fa3 = ("flash_attn" in errors and errors["flash_attn"] is None,
                "flash_attn_interface" in errors and errors["flash_attn_interface"] is None)
    broken = "; ".join(f"{name} is installed but does not import ({error})" for name, error in errors.items() if error)
    hub, hub_error = False, None
    if cuda and found("kernels") and "flash_attn" not in errors and not (fa3 and major == 9):
        hub_error = hub_flash_error()
        hub = hub_error is None
    return Kernels(cuda=cuda, hopper=major == 9, flash_attn_2=fa2, flash_attn_3=fa3, kernels_hub=hub,
                   kernels_hub_error=hub_error, flash_attn_error=broken or None)


def import_error(name: str) -> str | None:
    """None when module `name` imports, else why not (one line)."""
    try:
        importlib.import_module(name)
    except Exception as exc:  # an ImportError (undefined symbol), an OSError from a missing CUDA library...
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no message'}"
    return None


@functools.cache
def hub_flash_error() -> str | None:
    """None when transformers can load the kernels hub's flash attention, else why not (one line).
    It is transformers' own loader, the call from_pretrained makes for flash_attention_2 without
    flash_attn (modeling_utils._check_and_adjust_attn_implementation): it refuses a `kernels`
    version outside the range it supports, and offline (HF_HUB_OFFLINE=1, as the SLURM script
    sets) it fails on a kernel not in the hub cache. A success fetches (or finds) the kernel,
    so the model load that follows reuses it."""
    from transformers.modeling_flash_attention_utils import (
        FLASH_ATTN_KERNEL_FALLBACK,
        lazy_import_flash_attention,
    )

    try:
        lazy_import_flash_attention(FLASH_ATTN_KERNEL_FALLBACK["flash_attention_2"])
    except Exception as exc:  # whatever the loader raises is the reason to fall back
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no message'}"
    return None


def choose_attention(requested: str | None, kernels: Kernels, half_precision: bool) -> tuple[str, str]:
    """(attn_implementation, why). `auto` takes a varlen flash kernel on CUDA where one is
    installed: padding-free rows then run per example with no mask. Under SDPA a padding-free
    row needs a dense block-diagonal T x T mask built from position_ids (transformers'
    masking_utils.find_packed_sequence_indices), which rules out SDPA's flash kernel and
    computes every cross-example block too. Anything but `auto` is taken as given."""
    if requested not in (None, "auto"):
        if requested in FLASH and not kernels.cuda:
            raise PipelineError(f"attn_implementation: {requested} needs a CUDA GPU; use auto (sdpa on CPU)")
        return requested, f"attention: {requested} (as configured)"
    if not kernels.cuda:
        return "sdpa", "attention: sdpa (CPU: flash kernels need CUDA; SDPA is the fastest correct choice here)"
    if not half_precision:
        return "sdpa", "attention: sdpa (fp32 training: flash kernels take bf16/fp16 only)"
    if kernels.flash_attn_3 and kernels.hopper:
        return "flash_attention_3", "attention: flash_attention_3 (varlen FlashAttention 3 on Hopper)"
    if kernels.flash_attn_2:
        return "flash_attention_2", "attention: flash_attention_2 (varlen FlashAttention 2, flash_attn package)"
    if kernels.kernels_hub:
        # transformers maps flash_attention_2 to kernels-community/flash-attn2 when flash_attn is
        # missing and `kernels` is installed (fetched from the Hub once, then cached)
        return "flash_attention_2", "attention: flash_attention_2 via the kernels hub (kernels-community/flash-attn2)"
    if kernels.flash_attn_error:
        return "sdpa", (f"attention: sdpa ({kernels.flash_attn_error}; reinstall flash-attn built for this torch "
                        "and CUDA, or uninstall it)")
    if kernels.kernels_hub_error:
        return "sdpa", (f"attention: sdpa (the kernels hub's flash-attn2 cannot be loaded here: {kernels.kernels_hub_error}; "
                        "pip install flash-attn, or fetch the kernel into the hub cache while online)")
    return "sdpa", ("attention: sdpa (no flash kernel installed: padding-free rows use a dense block-diagonal mask, "
                    "several times the useful attention work; pip install flash-attn or kernels for the varlen path)")


def micro_batch_cap(batching: str, attention: str, max_per_device: int) -> tuple[int, str | None]:
    """(largest per-device micro-batch, why or None). A padding-free micro-batch of several
    trajectories is one row; without a varlen flash kernel that row needs a dense
    block-diagonal T x T mask (see choose_attention), so attention grows with the square of
    the packed length and SDPA loses its fused causal kernel. One trajectory per micro-batch
    needs no mask at all. Measured on this project's 2-core CPU (SmolLM2-135M, ReAct
    trajectories of ~440 tokens, 8 per step): 53 tokens/s packed 8 to a row, 115 one per row,
    71 padded (docs/training.md)."""
    if batching == "padding_free" and attention not in FLASH and max_per_device > 1:
        return 1, (f"micro-batch: 1 trajectory (padding-free under {attention} would pack several into one row "
                   "with a dense block-diagonal mask; set per_device_batch_size to override)")
    return max_per_device, None


def choose_loss(requested: str, cuda: bool) -> tuple[str, str]:
    """(model | chunked, why). `chunked` is TRL's default loss (a fused LM head that computes
    log-probs chunk by chunk, never the full [tokens x vocab] fp32 logits: GBs at 8B shapes);
    its non-Triton fallback is several times slower on CPU, where the model's own
    cross-entropy gives the same loss (../shared/RUNTIME.md)."""
    if requested == "auto":
        requested = "chunked" if cuda else "model"
        why = "GPU: TRL's fused chunked LM head, no full fp32 logits" if cuda else "CPU: the model's own cross-entropy, faster here"
        return requested, f"loss: {requested} ({why})"
    if requested not in ("model", "chunked"):
        raise PipelineError(f"loss: '{requested}' is not one of auto, model, chunked")
    return requested, f"loss: {requested} (as configured)"


@dataclass(frozen=True)
class FsdpPlan:
    transformers_checkpointing: bool  # transformers' activation checkpointing (off under FSDP)
    checkpointing: bool  # activations recomputed at all (FLOPs accounting)
    state_dict_type: str | None  # how checkpoints are written (None: not FSDP)
    final_gather: bool  # final/ needs an explicit full gather (sharded checkpoints write no HF folder)

    def describe(self) -> str:
        if self.state_dict_type is None:
            return f"activation checkpointing {'on' if self.checkpointing else 'off'}"
        recompute = "FSDP's own" if self.checkpointing else "off"
        return f"FSDP: activation checkpointing {recompute}, checkpoints as {self.state_dict_type}, final/ gathered in full"


def fsdp_plan(gradient_checkpointing: bool, env: dict | None = None) -> FsdpPlan:
    """Checkpointing and saving under FSDP, from the variables `accelerate launch` sets from the
    accelerate config's fsdp_config. FSDP wraps each decoder layer: its own activation
    checkpointing recomputes inside the wrapped unit with the parameters already gathered, where
    transformers' (outside FSDP's units) needs a second all-gather per layer; transformers refuses
    both at once (Trainer: "can't both be set to True")."""
    env = os.environ if env is None else env
    if Launch.from_env(env).strategy != "fsdp":
        return FsdpPlan(gradient_checkpointing, gradient_checkpointing, None, False)
    fsdp_ac = env.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true"
    if gradient_checkpointing and not fsdp_ac:
        raise PipelineError("gradient_checkpointing: true under FSDP needs FSDP's own: set "
                            "fsdp_activation_checkpointing: true in the accelerate config (accelerate_configs/fsdp.yaml)")
    version = env.get("FSDP_VERSION", "1")
    state_dict_type = env.get("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT" if version == "1" else "SHARDED_STATE_DICT").upper()
    return FsdpPlan(False, fsdp_ac, state_dict_type, True)
