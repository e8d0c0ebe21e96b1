"""A training launch's peak memory per GPU, estimated before anything loads: what `run --rehearse`
prints beside the target node's memory and refuses when it cannot fit (docs/full-scale.md,
"Training memory per GPU").

Model states follow DeepSpeed's own estimators (deepspeed/runtime/zero/stage_1_and_2.py
estimate_zero2_model_states_mem_needs, stage3.py estimate_zero3_model_states_mem_needs), which
count, per trained parameter: 2 B of 16-bit weights, 2 B of 16-bit gradients, 4 B of fp32
gradients, 4 B of fp32 master weights and 8 B of Adam moments (18 B, the figure accelerate's
`estimate-memory` gives for mixed-precision Adam too):
  ZeRO-2          2 N + 18 N / G        (the 16-bit weights replicated, the rest sharded)
  ZeRO-3          4 L + 18 N / G        (L: the largest layer, gathered whole for its forward)
  ZeRO-3 offload  4 L                   (weights and optimizer on the CPU)
  DDP, one GPU    18 N                  (nothing sharded; accelerate's estimate-memory figure)
  FSDP            4 L + 18 N / G        (full shard, as ZeRO-3)
Where ours differs from theirs:
- LoRA / QLoRA: DeepSpeed and accelerate count every parameter as trained. Here the frozen base
  holds only its weights (2 B per parameter in bf16; QLoRA 0.52 B: 4-bit NF4 with double-quantised
  constants, bitsandbytes; the embeddings and LM head stay 16-bit), sharded by ZeRO-3 and
  replicated otherwise; the adapter's A parameters take the 18 B each.
- fp32 training (no mixed precision): 4 B weights + 4 B gradients + 8 B Adam = 16 B, no master copy.
- Activations, which the estimators leave out: per micro-batch of T tokens (micro-batch x
  sequence length) and layer, with activation checkpointing the layer's 16-bit input (2 T h B)
  kept for every layer plus one layer's full working set while it is recomputed; without it every
  layer's (~34 T h B, Korthikanti et al. 2022 with a flash kernel: no s^2 attention scores). The
  LM head's fp32 logits and their gradient (8 T V B) unless the chunked loss is used.
- A fixed 1 GiB for the CUDA context and the communication buffers.
These are estimates for the plan (an allocator's fragmentation is not in them): they refuse what
cannot fit by a margin and say the figure beside the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 2**30
OVERHEAD_BYTES = 1 * GIB  # CUDA context (~0.5 GiB) and NCCL buffers
STATE_BYTES = 18  # per trained parameter under mixed precision (DeepSpeed's count)
FP32_STATE_BYTES = 16  # fp32 weights, gradients and Adam moments: no separate master copy
QLORA_BYTES = 0.52  # NF4 (4 bits) + double-quantised constants per quantised parameter
ACTIVATION_BYTES = 34  # per token, hidden unit and layer without checkpointing (16-bit)
# Target module -> (in, out) widths in terms of the shape, for the adapter's size
LORA_WIDTHS = {
    "q_proj": lambda s: (s.hidden, s.heads_dim), "k_proj": lambda s: (s.hidden, s.kv_dim),
    "v_proj": lambda s: (s.hidden, s.kv_dim), "o_proj": lambda s: (s.heads_dim, s.hidden),
    "gate_proj": lambda s: (s.hidden, s.intermediate), "up_proj": lambda s: (s.hidden, s.intermediate),
    "down_proj": lambda s: (s.intermediate, s.hidden),
}


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes, from its config.json (transformers' names)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @property
    def heads_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Every parameter: attention, the gated MLP, two norms per layer; the embeddings (twice if untied)."""
        attention = self.hidden * self.heads_dim * 2 + self.hidden * self.kv_dim * 2
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * layer + self.embedding * (1 if self.tied else 2) + self.hidden

    @property
    def largest_layer(self) -> int:
        """The largest single module (DeepSpeed's largest_layer_params): the embedding, in these models."""
        return max(self.embedding, self.hidden * self.intermediate)


def shape_of(config: dict) -> Shape:
    """A Shape from a config.json (a multimodal Gemma 3 keeps its LM's in text_config)."""
    text = config.get("text_config") or config
    heads = int(text["num_attention_heads"])
    hidden = int(text["hidden_size"])
    return Shape(int(text["num_hidden_layers"]), hidden, int(text["intermediate_size"]), heads,
                 int(text.get("num_key_value_heads") or heads), int(text.get("head_dim") or hidden // heads),
                 int(text.get("vocab_size") or config.get("vocab_size")),
                 bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))))


# The published config.json sizes of the families the shipped configs name (lower case, without a
# -Instruct / -FP8 suffix), for models not on disk (gated, or not fetched yet)
KNOWN_SHAPES = {
    "meta-llama/llama-3.1-8b": Shape(32, 4096, 14336, 32, 8, 128, 128256, False),
    "meta-llama/llama-3.1-70b": Shape(80, 8192, 28672, 64, 8, 128, 128256, False),
    "meta-llama/llama-3.1-405b": Shape(126, 16384, 53248, 128, 8, 128, 128256, False),
    "qwen/qwen2.5-7b": Shape(28, 3584, 18944, 28, 4, 128, 152064, False),
    "qwen/qwen2.5-72b": Shape(80, 8192, 29568, 64, 8, 128, 152064, False),
    "google/gemma-3-270m": Shape(18, 640, 2048, 4, 1, 256, 262144, True),
    "google/gemma-3-1b": Shape(26, 1152, 6912, 4, 1, 256, 262144, True),
    "huggingfacetb/smollm2-135m": Shape(30, 576, 1536, 9, 3, 64, 49152, True),
}


@dataclass(frozen=True)
class Launch:
    """What decides a training launch's memory per GPU."""

    shape: Shape
    strategy: str  # zero2 | zero3 | zero3_offload | fsdp | ddp
    gpus: int  # processes sharing the shards (one per GPU)
    finetuning: str  # full | lora | qlora
    lora_r: int
    lora_targets: tuple[str, ...]
    micro_batch: int  # sequences per forward
    seq_len: int  # tokens per sequence (the longest the launch may see)
    checkpointing: bool
    chunked_loss: bool
    mixed: bool = True  # bf16 / fp16 mixed precision; False: fp32
    extra_bytes: int = 0  # what else sits on each GPU (GRPO: a reference model, vLLM's colocated share)
    extra_what: str = ""


@dataclass(frozen=True)
class Estimate:
    states: int  # weights, gradients, optimizer states on one GPU
    activations: int
    extra: int
    overhead: int

    @property
    def total(self) -> int:
        return self.states + self.activations + self.extra + self.overhead


def adapter_params(shape: Shape, r: int, targets: tuple[str, ...]) -> int:
    """LoRA's A and B of every targeted module: r x (in + out) each, in every layer."""
    return shape.layers * sum(r * sum(LORA_WIDTHS[t](shape)) for t in targets if t in LORA_WIDTHS)


def model_states(launch: Launch) -> int:
    """Weights, gradients and optimizer states on one GPU (DeepSpeed's arithmetic, see above)."""
    s, g = launch.shape, max(1, launch.gpus)
    state = STATE_BYTES if launch.mixed else FP32_STATE_BYTES
    weight = 2 if launch.mixed else 4
    if launch.finetuning == "full":
        trained, frozen = s.params, 0.0
    else:
        trained = adapter_params(s, launch.lora_r, launch.lora_targets)
        if launch.finetuning == "qlora":  # the embeddings and LM head stay 16-bit
            kept = s.embedding * (1 if s.tied else 2)
            frozen = (s.params - kept) * QLORA_BYTES + kept * weight
        else:
            frozen = s.params * weight
    gathered = 4 * s.largest_layer
    if launch.strategy == "zero3_offload":
        return int(gathered)
    if launch.strategy in ("zero3", "fsdp"):
        return int(gathered + frozen / g + state * trained / g)
    if launch.strategy == "zero2":  # DeepSpeed's 2 N + 18 N / G: the 16-bit weights replicated
        return int(frozen + weight * trained + state * trained / g)
    return int(frozen + state * trained)  # DDP or one GPU: accelerate's 18 B per parameter, all of it here

def activations(launch: Launch) -> int:
    s = launch.shape
    tokens = launch.micro_batch * launch.seq_len
    width = 2 if launch.mixed else 4
    per_layer = ACTIVATION_BYTES * tokens * s.hidden * width // 2
    kept = (width * tokens * s.hidden * s.layers + per_layer) if launch.checkpointing else per_layer * s.layers
    logits = 0 if launch.chunked_loss else 8 * tokens * s.vocab
    return int(kept + logits)


def estimate(launch: Launch) -> Estimate:
    return Estimate(model_states(launch), activations(launch), launch.extra_bytes, OVERHEAD_BYTES)


def gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def describe(est: Estimate, extra_what: str = "") -> str:
    """`~48.5 GiB (weights/gradients/optimizer 46.1 + activations 1.4 + CUDA context 1.0)`."""
    extra = f" + {extra_what} {gib(est.extra)}" if est.extra else ""
    return (f"~{gib(est.total)} GiB (weights/gradients/optimizer {gib(est.states)} + activations "
            f"{gib(est.activations)}{extra} + CUDA context {gib(est.overhead)})")


def knobs(launch: Launch, qlora: bool = True) -> list[tuple[str, Launch]]:
    """The single changes that lower a launch's memory, in the order a user would try them: what
    costs no quality first (checkpointing, a smaller micro-batch, more sharding), then LoRA / QLoRA."""
    out = []
    if not launch.checkpointing:
        out.append(("gradient_checkpointing: true", replace(launch, checkpointing=True)))
    if launch.micro_batch > 1:
        out.append(("max_per_device_batch_size: 1 (more accumulation steps, the same global batch)",
                    replace(launch, micro_batch=1)))
    if launch.strategy in ("ddp", "zero2"):
        out.append(("accelerate_config: deepspeed_zero3", replace(launch, strategy="zero3")))
    if launch.strategy != "zero3_offload":
        out.append(("accelerate_config: deepspeed_zero3_offload (slower: weights and optimizer on the CPU)",
                    replace(launch, strategy="zero3_offload")))
    if launch.finetuning == "full":
        out.append(("finetuning: lora", replace(launch, finetuning="lora")))
    if qlora and launch.finetuning in ("full", "lora"):  # GRPO trains no QLoRA here
        out.append(("finetuning: qlora", replace(launch, finetuning="qlora")))
    return out


def what_fits(launch: Launch, limit: int, qlora: bool = True) -> str:
    """The first single knob whose estimate fits `limit` bytes, else the fewest of them together
    (in knobs' order), said with the figure."""
    changes = knobs(launch, qlora)
    for knob, changed in changes:
        total = estimate(changed).total
        if total <= limit:
            return f"set {knob} ({gib(total)} GiB)"
    together, said = launch, []
    for knob, _ in changes:
        together = dict(knobs(together, qlora)).get(knob, together)
        said.append(knob)
        total = estimate(together).total
        if total <= limit:
            return f"set {' and '.join(said)} ({gib(total)} GiB)"
    return "no setting here fits it: a node with more or larger GPUs, or a smaller model"
