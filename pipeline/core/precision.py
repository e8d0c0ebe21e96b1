"""Which floating-point precision training and generation use, and why: the one place for the rule.

    precision: auto   ->  a GPU with bf16: bf16 | another GPU: fp16 (inference) / fp32 (training)
                          a CPU with native bf16 (avx512_bf16 or amx_bf16): bf16 | any other CPU: fp32
    precision: bf16 / fp32 / fp16 (a config's explicit value) always wins.

`REACT_PIPELINE_PRECISION=auto|bf16|fp32` replaces `auto` wherever it stands (a whole test
suite or demo in one precision); an explicit config value still wins over it. Training keeps
fp32 master weights and runs the forward/backward under bf16 autocast (the Trainer's
`bf16=True`), except under DeepSpeed, which keeps the fp32 master copy in its optimizer and
the model in bf16 (`weights` says what the student loads in); inference loads the weights in
the chosen dtype. Every choice prints one line
(`Choice.line`) saying what was chosen and why, and the outputs record it (manifests, summary
rows), so runs in different precisions are never mixed silently.

Why not bf16 everywhere: a CPU without bf16 instructions (e.g. AVX2-only) emulates it, and a
bf16 matmul there runs several times *slower* than fp32 (`bench/bench_train.py` measures it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import devices
from pipeline.core.errors import PipelineError

ENV = "REACT_PIPELINE_PRECISION"
PRECISIONS = ("bf16", "fp32", "fp16")
# The LLM config's dtype names (transformers' spelling) <-> ours.
DTYPE_NAMES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo names of the bf16 dot-product units
DEEPSPEED_CPU = "ZeRO on CPU needs bf16=False (RUNTIME.md: bf16 needs use_cpu, which disables DeepSpeed)"


@dataclass(frozen=True)
class Choice:
    precision: str  # bf16 | fp32 | fp16
    reason: str

    def line(self, what: str) -> str:
        return f"[precision] {what}: {self.precision} ({self.reason})"

    @property
    def torch_dtype(self):
        import torch
        return {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[self.precision]


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:  # not Linux: torch's own report decides
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return set(line.partition(":")[2].split())


def cpu_bf16(flags: set[str] | None = None) -> tuple[bool, str]:
    """(native bf16 on this CPU?, why): the CPU's flags where they can be read, else what torch's
    kernels report. Read flags answer alone, so that planning on a CPU without bf16 imports no torch."""
    flags = cpu_flags() if flags is None else flags
    found = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if found:
        return True, f"the CPU has {' and '.join(found)}"
    if flags:
        return False, f"the CPU has no {' / '.join(NATIVE_BF16_FLAGS)}: bf16 would be emulated, slower than fp32"
    import torch
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    if any(probe is not None and probe() for probe in probes):
        return True, "torch reports AVX512-BF16 / AMX on this CPU"
    capability = torch.backends.cpu.get_cpu_capability()
    return False, (f"the CPU has no {' / '.join(NATIVE_BF16_FLAGS)} (torch's kernels: {capability}): "
                   "bf16 would be emulated, slower than fp32")


def requested(value: str) -> tuple[str, str]:
    """The precision asked for and by whom: an explicit config value, else the environment, else auto."""
    if value != "auto":
        return value, "set in the config"
    env = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if env not in ("auto", "bf16", "fp32"):
        raise PipelineError(f"{ENV}={env!r}: use auto, bf16 or fp32 (or unset it)")
    return env, ("" if env == "auto" else f"{ENV}={env}")


def training(value: str, *, deepspeed: bool = False) -> Choice:
    """The precision a training run uses: bf16 means bf16 autocast over fp32 master weights."""
    want, who = requested(value)
    if want not in ("auto", *PRECISIONS):
        raise PipelineError(f"precision: unknown {want!r}; use auto, {', '.join(PRECISIONS)}")
    if devices.gpu_count():
        import torch
        gpu_bf16 = torch.cuda.is_bf16_supported()
        if want == "auto":
            return Choice("bf16", "the GPU supports bf16") if gpu_bf16 else Choice("fp32", "the GPU has no bf16")
        if want == "bf16" and not gpu_bf16:
            raise PipelineError("precision: bf16 asked for, but this GPU has no bf16 support; use precision=fp16 or fp32")
        return Choice(want, who)
    if want == "fp16":
        raise PipelineError("precision: fp16 training needs a GPU; on CPU use bf16 or fp32 (or auto)")
    native, why = cpu_bf16()
    if deepspeed and want in ("auto", "bf16"):
        if want == "bf16" and who == "set in the config":
            raise PipelineError(f"precision: bf16 under DeepSpeed on CPU is not possible: {DEEPSPEED_CPU}; "
                                "set precision=fp32 (or auto), or use accelerate_config=cpu / cpu_ddp for bf16")
        return Choice("fp32", DEEPSPEED_CPU)
    if want == "auto":
        return Choice("bf16" if native else "fp32", why)
    return Choice(want, who if want == "fp32" or native else f"{who}; {why}")


def weights(training_precision: str, finetuning: str, strategy: str) -> Choice:
    """The dtype the student's weights load in, for a run training in `training_precision`.

    Full fine-tuning under the Trainer's own mixed precision (one process, DDP, FSDP) needs fp32
    weights: they are the master copy that autocast computes from and the optimizer updates.
    DeepSpeed (strategy zero2 / zero3) keeps that fp32 copy itself, in its optimizer's partitions,
    made from the model's half-precision parameters: the engine casts an fp32 model to bf16 before
    anything else (engine._configure_distributed_model), and ZeRO-3's zero.Init creates the
    parameters in the config's dtype, so loading fp32 only costs host memory on every rank (8B:
    ~32 GB per rank, ~256 GB per 8-GPU node) for a cast that follows at once. Adapters (LoRA,
    QLoRA) train on a frozen base, kept in the training precision."""
    half = training_precision in ("bf16", "fp16")
    if finetuning != "full":
        return (Choice("bf16", "adapters train on a frozen base, kept in bf16") if training_precision == "bf16"
                else Choice("fp32", f"adapters on a frozen base, trained in {training_precision}"))
    if half and strategy.startswith("zero"):
        return Choice(training_precision, f"{strategy} keeps the fp32 master weights in its optimizer and trains "
                                          f"the model in {training_precision}; fp32 weights would only be cast on load")
    if half:
        return Choice("fp32", f"{training_precision} mixed precision: autocast over fp32 master weights ({strategy})")
    return Choice("fp32", f"{training_precision} training")


def inference(dtype: str, device_type: str) -> Choice:
    """The dtype a transformers model is loaded in (`dtype` in the LLM config's spelling)."""
    if dtype != "auto" and dtype not in DTYPE_NAMES:
        raise PipelineError(f"llm.dtype: unknown dtype {dtype!r}; use one of auto, {', '.join(DTYPE_NAMES)}")
    want, who = requested(DTYPE_NAMES.get(dtype, "auto"))
    if want != "auto":
        return Choice(want, who)
    if device_type == "cuda":
        import torch
        return (Choice("bf16", "the GPU supports bf16") if torch.cuda.is_bf16_supported()
                else Choice("fp16", "the GPU has no bf16"))
    if device_type != "cpu":
        return Choice("fp32", f"device {device_type}: fp32 unless asked")
    native, why = cpu_bf16()
    return Choice("bf16" if native else "fp32", why)


def dtype_name(precision: str) -> str:
    """bf16 -> bfloat16: the LLM config's spelling of one of ours."""
    return {v: k for k, v in DTYPE_NAMES.items()}[precision]
