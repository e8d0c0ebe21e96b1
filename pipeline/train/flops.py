"""Training FLOPs from a model config, peak FLOP/s of known GPUs, and MFU per logged step.

Per trained token (Kaplan et al. 2020; PaLM appendix B), with N the parameters that take part in
matrix multiplies (every linear layer and the LM head; the input embedding is a lookup):

    forward                       2 N
    backward, activation grads    2 N
    backward, weight grads        2 N    (full fine-tuning; LoRA's adapters add ~nothing: 0 here)
    recompute (checkpointing)     2 N    (a second forward; hardware work, not model work)
    attention scores + mix        12 L d s per token fwd+bwd (PaLM's 12 L H Q T), s = the token's
                                  own example length (a padding-free row holds several examples)

So full fine-tuning is 6 N D model FLOPs (8 N D with checkpointing: what the GPUs execute), LoRA
4 N D (6 N D). MFU = model FLOP/s / peak (PaLM's definition: recompute excluded); HFU counts
the recompute. Both are logged, with the achieved TFLOP/s per GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# Dense bf16/fp16 tensor-core peak per GPU, in TFLOP/s (vendor datasheets, no sparsity).
# Matched against torch.cuda.get_device_name() in this order (the first substring that occurs).
PEAK_TFLOPS = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
    ("H800", 989.0), ("H20", 148.0), ("B200", 2250.0), ("B100", 1750.0), ("A100", 312.0),
    ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
    ("A6000", 155.0), ("V100", 125.0), ("MI300X", 1307.0), ("MI250", 362.0),
)


def peak_tflops(device_name: str | None) -> float | None:
    """Peak bf16 TFLOP/s of a GPU by name; None when unknown (declare `peak_tflops` then)."""
    if not device_name:
        return None
    for key, tflops in PEAK_TFLOPS:
        if key in device_name:
            return tflops
    return None


def matmul_params(config) -> int:
    """Parameters in matrix multiplies per token, from a (Llama/Qwen-style) model config."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    attention = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2  # q, o; k, v
    mlp = 3 * h * config.intermediate_size  # gate, up, down
    return layers * (attention + mlp) + h * config.vocab_size  # + the LM head (tied or not)


@dataclass(frozen=True)
class FlopsPerToken:
    model: float  # model FLOPs per trained token (MFU's numerator)
    hardware: float  # + the recompute of activation checkpointing (HFU's)


def flops_per_token(config, *, full_finetuning: bool, checkpointing: bool, attention_length: float) -> FlopsPerToken:
    """Training FLOPs per token; `attention_length` is the token-weighted mean example length
    (sum of s^2 / sum of s), the context each token attends over on average."""
    n = matmul_params(config)
    heads = config.num_attention_heads
    d_attn = (getattr(config, "head_dim", None) or config.hidden_size // heads) * heads
    passes = 3 if full_finetuning else 2  # forward, activation grads, (weight grads)
    attention = 4 * config.num_hidden_layers * d_attn * attention_length  # forward: QK^T and AV
    model = passes * 2 * n + attention * 3  # attention's backward is twice its forward
    recompute = (2 * n + attention) if checkpointing else 0.0
    return FlopsPerToken(model=model, hardware=model + recompute)


def attention_length(lengths: list[int]) -> float:
    total = sum(lengths)
    return sum(s * s for s in lengths) / total if total else 0.0


class ThroughputMeter:
    """Times the training steps (not saves or evaluation) and turns the tokens trained between
    two logs into TFLOP/s per GPU, MFU and HFU. A TrainerCallback; the trainer's `log` asks it
    for the figures of each logged step (see pipeline.train.trainer).

    A launch's first step is left out of the figures, its time and its tokens alike: it carries
    the warm-up (CUDA context and kernel selection, the allocator's first growth, DeepSpeed's and
    FSDP's first gathers, a resume's state loading), so the first logged step (logging_first_step)
    has no figures and every later one measures steady training only."""

    def __init__(self, per_token: FlopsPerToken, processes: int, peak: float | None):
        self.per_token, self.processes, self.peak = per_token, processes, peak
        self._seconds = 0.0
        self._started: float | None = None
        self._tokens_at_last_log: int | None = None
        self._warming_up = True

    def callback(self):
        from transformers import TrainerCallback
        meter = self

        class ThroughputCallback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                meter._tokens_at_last_log, meter._seconds = state.num_input_tokens_seen, 0.0  # restored on resume
                meter._warming_up = True

            def on_step_begin(self, args, state, control, **kwargs):
                meter._started = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                if meter._warming_up:  # the figures start after it (class docstring)
                    meter.end_warm_up(state.num_input_tokens_seen)
                elif meter._started is not None:
                    meter._seconds += time.perf_counter() - meter._started
                meter._started = None

        return ThroughputCallback()

    def end_warm_up(self, tokens_seen: int) -> None:
        """The launch's first step is over: the figures count from here (class docstring)."""
        self._tokens_at_last_log, self._warming_up = tokens_seen, False

    def metrics(self, tokens_seen: int) -> dict[str, float]:
        """Figures since the last call; tokens_seen counts every process's tokens."""
        tokens = tokens_seen - (self._tokens_at_last_log or 0)
        if self._seconds <= 0 or tokens <= 0:
            return {}
        per_gpu = tokens / self._seconds / self.processes
        out = {"tokens_per_s_per_device": round(per_gpu, 1),
               "tflops_per_device": round(per_gpu * self.per_token.model / 1e12, 3)}
        if self.peak:
            out["mfu"] = round(per_gpu * self.per_token.model / (self.peak * 1e12), 4)
            out["hfu"] = round(per_gpu * self.per_token.hardware / (self.peak * 1e12), 4)
        self._tokens_at_last_log, self._seconds = tokens_seen, 0.0
        return out
