"""Local generation with transformers: batched, per-sequence stop strings, a shared-prefix cache.

    from pipeline.llm.config import LLMConfig
    from pipeline.llm.hf import TransformersLLM
    llm = TransformersLLM(LLMConfig(model="smollm2"))      # or a dir, a hub id, a .gguf file
    llm.generate([GenerationRequest("Question: ...\\nThought 1:", stop=["\\nObservation 1:"])])

Why a hand-written decoding loop instead of `model.generate`:
- each sequence has its own stop strings and token budget (episodes wait at different steps);
- a finished sequence leaves the batch at once (its rows are dropped from the KV cache), so
  the remaining ones run at a smaller batch instead of dragging padding along;
- few-shot prompts share a ~1,500-token exemplar prefix. Its KV cache is computed once and kept
  across calls; each call only pre-fills what follows it. Batch layout is
  [shared prefix][left padding][own suffix] with an attention mask and explicit position ids,
  so every row sees exactly the positions it would see alone.
Greedy output is the same token for token whatever the batch (tested in fp32).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core import devices
from pipeline.core.errors import PipelineError
from pipeline.hub.models import EMBEDDED, load_tokenizer, looks_like_path, resolve_model_path
from pipeline.llm.base import Completion, GenerationRequest, cut_at_stop
from pipeline.llm.config import LLMConfig

# Below this many shared tokens, a separate prefix pass is not worth its overhead.
MIN_SHARED_PREFIX = 32
@dataclass
class _Row:
    """One sequence to decode: a request's prompt (and its sample index when n > 1)."""

    request: int
    sample: int
    ids: list[int]
    max_new: int
    stop: list[str]
    temperature: float
    seed: int | None
    generated: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None


def resolve_model_source(cfg: LLMConfig) -> tuple[str, dict[str, Any]]:
    """(what to pass to from_pretrained, extra kwargs) for cfg.model; PipelineError when a local
    path is named but missing."""
    model = cfg.model
    if model in EMBEDDED:  # an embedded model's alias: its converted folder
        return resolve_model_path(model), {}
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        if not path.is_file():
            raise PipelineError(f"llm.model: GGUF file {model} not found; give an existing .gguf file")
        return str(path.parent), {"gguf_file": path.name}
    if cfg.gguf_file:
        if not (path / cfg.gguf_file).is_file():
            raise PipelineError(f"llm.gguf_file: {path / cfg.gguf_file} not found; check llm.model and llm.gguf_file")
        return str(path), {"gguf_file": cfg.gguf_file}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PipelineError(f"llm.model: {model} has no config.json; it is not a transformers checkpoint")
        return str(path), {}
    if looks_like_path(model):
        raise PipelineError(f"llm.model: model directory {model} not found; give an existing directory, a hub id, a .gguf file, or an embedded model ({', '.join(EMBEDDED)})")
    return model, {}  # a hub id


class TransformersLLM:
    """`LLM` backed by a local transformers causal LM (see the module docstring)."""

    def __init__(self, cfg: LLMConfig):
        import torch

        device = torch.device(_resolve_device(cfg.device))
        dtype = _resolve_dtype(cfg.dtype, device)
        source, kwargs = resolve_model_source(cfg)
        tokenizer = _load_tokenizer(source, kwargs, cfg)
        model = _load_model(source, kwargs, cfg, dtype, device)
        if cfg.adapter:
            model = _apply_adapter(model, cfg.adapter)
        model.eval()
        self._setup(cfg, model, tokenizer, device, dtype)

    @classmethod
    def from_loaded(cls, cfg: LLMConfig, model, tokenizer):
        """The same decoding over a model already in memory (GRPO's policy, mid-training): its
        device, dtype and train/eval mode are left as they are."""
        self = cls.__new__(cls)
        self._setup(cfg, model, tokenizer, model.device, model.dtype)
        return self

    def _setup(self, cfg: LLMConfig, model, tokenizer, device, dtype) -> None:
        self.cfg = cfg
        self.name = cfg.label
        self.device, self.dtype = device, dtype
        self.tokenizer, self.model = tokenizer, model
        self.max_context = _context_window(cfg, self.model, self.tokenizer)
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        self.max_batch_size = max(1, int(cfg.max_batch_size))
        self._plain_kv = _plain_dynamic_cache(self.model)
        # cfg.extra["prefix_cache"]=False turns the shared-prefix cache off (benchmarks, debugging).
        self.use_prefix_cache = bool(cfg.extra.get("prefix_cache", True)) and self._plain_kv
        # transformers 5.x renamed `past_key_values` to `cache`; older releases know only the former.
        # A PEFT model passes either on to its base model, whose signature says which.
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        self._cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        self._prefix_ids: list[int] = []
        self._prefix_cache = None
        self.stats = {"calls": 0, "sequences": 0, "forward_passes": 0, "prefix_tokens_reused": 0, "prefill_tokens": 0}

    # ---- public ---------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        self.stats["calls"] += 1
        results: list[list[Completion | None]] = [[None] * max(r.n, 1) for r in requests]
        rows: list[_Row] = []
        for i, req in enumerate(requests):
            problem = _invalid(req)
            ids = [] if problem else self._prompt_ids(req)
            if not problem and len(ids) > self.max_context:
                problem = f"context window exceeded: {len(ids)} > {self.max_context} tokens"
            if problem:
                results[i] = [Completion("", len(ids), 0, "error", problem) for _ in range(max(req.n, 1))]
                continue
            samples = 1 if req.temperature == 0 else req.n  # greedy samples are all the same
            budget = min(req.max_new_tokens, self.max_context - len(ids))
            for j in range(samples):
                rows.append(_Row(i, j, ids, budget, list(req.stop), req.temperature, req.seed))
        rows.sort(key=lambda r: len(r.ids))  # similar lengths together: less padding
        for start in range(0, len(rows), self.max_batch_size):
            group = rows[start : start + self.max_batch_size]
            try:
                self._decode_group(group)
            except Exception as exc:  # e.g. out of memory: these requests fail, the others go on
                for row in group:
                    row.finish, row.text = "error", f"{type(exc).__name__}: {exc}"
        for row in rows:
            results[row.request][row.sample] = self._completion(row)
        for i, req in enumerate(requests):
            if req.temperature == 0 and results[i][0] is not None and results[i][0].finish_reason != "error":
                results[i] = [results[i][0]] * len(results[i])
        return results  # type: ignore[return-value]

    # ---- decoding -------------------------------------------------------------------------
    def _prompt_ids(self, req: GenerationRequest) -> list[int]:
        return self.tokenizer(req.prompt).input_ids

    def _completion(self, row: _Row) -> Completion:
        if row.finish == "error":
            return Completion("", len(row.ids), 0, "error", row.text)
        return Completion(row.text, len(row.ids), len(row.generated), row.finish or "length")

    def _decode_group(self, group: list[_Row]) -> None:
        import torch

        live = [r for r in group if r.max_new > 0]
        for r in group:
            if r.max_new <= 0:
                r.finish = "length"
        if not live:
            return
        self.stats["sequences"] += len(live)
        with torch.inference_mode():
            logits, cache, mask, positions = self._prefill(live)
            generators = [_generator(r) for r in live]
            while live:
                tokens = _pick_tokens(logits, live, generators)
                keep = [k for k, (r, t) in enumerate(zip(live, tokens.tolist(), strict=True)) if not self._advance(r, t)]
                if not keep:
                    return
                if len(keep) < len(live):  # drop finished rows so they cost nothing further
                    idx = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(idx)
                    mask, positions, tokens = mask[idx], positions[idx], tokens[idx]
                    live = [live[k] for k in keep]
                    generators = [generators[k] for k in keep]
                mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
                positions = positions + 1
                out = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                                 use_cache=True, **{self._cache_kw: cache})
                self.stats["forward_passes"] += 1
                logits = out.logits[:, -1, :]

    def _advance(self, row: _Row, token: int) -> bool:
        """Record one new token; True when the row is finished."""
        if token in self.eos_ids:
            row.finish = "stop"
            row.text = self.tokenizer.decode(row.generated, skip_special_tokens=True)
            return True
        row.generated.append(token)
        text = self.tokenizer.decode(row.generated, skip_special_tokens=True)
        cut, stopped = cut_at_stop(text, row.stop)
        row.text = cut
        if stopped:
            row.finish = "stop"
        elif len(row.generated) >= row.max_new:
            row.finish = "length"
        return row.finish is not None

    def _prefill(self, rows: list[_Row]):
        """Run the prompts; returns (last logits, cache, attention mask, last positions)."""
        import torch
        from transformers import DynamicCache

        shared = self._shared_prefix(rows) if self.use_prefix_cache else 0
        suffixes = [r.ids[shared:] for r in rows]
        width = max(len(s) for s in suffixes)
        batch = len(rows)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for b, s in enumerate(suffixes):
            input_ids[b, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[b, shared + width - len(s) :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        input_ids, mask, positions = input_ids.to(self.device), mask.to(self.device), positions.to(self.device)
        capacity = shared + width + max(r.max_new for r in rows)
        cache = _preallocated_cache(self.model.config, capacity) if self._plain_kv else DynamicCache(config=self.model.config)
        if shared:
            for layer, (k, v, _) in zip(cache.layers, self._prefix_cache, strict=True):
                layer.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions[:, shared:],
                         use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
        self.stats["forward_passes"] += 1
        self.stats["prefill_tokens"] += sum(len(s) for s in suffixes)
        return out.logits[:, -1, :], cache, mask, positions[:, -1]

    def _shared_prefix(self, rows: list[_Row]) -> int:
        """Length of the token prefix all rows share, with its KV cache ready in
        self._prefix_cache (kept across calls: the next call's exemplars are the same)."""
        import torch
        from transformers import DynamicCache

        shared = min(_common_prefix_len([r.ids for r in rows]), min(len(r.ids) for r in rows) - 1)
        if shared < MIN_SHARED_PREFIX:
            return 0
        target = rows[0].ids[:shared]
        keep = _common_prefix_len([self._prefix_ids, target]) if self._prefix_cache is not None else 0
        if keep < MIN_SHARED_PREFIX:
            self._prefix_cache, self._prefix_ids, keep = DynamicCache(config=self.model.config), [], 0
        elif keep < len(self._prefix_ids):
            self._prefix_cache.crop(keep - len(self._prefix_ids))
            self._prefix_ids = self._prefix_ids[:keep]
        self.stats["prefix_tokens_reused"] += keep
        if keep < shared:  # extend the stored prefix by what this call adds
            new = torch.tensor([target[keep:]], dtype=torch.long, device=self.device)
            positions = torch.arange(keep, shared, device=self.device)[None, :]
            try:
                self.model(input_ids=new, position_ids=positions, use_cache=True, logits_to_keep=1,
                           **{self._cache_kw: self._prefix_cache})
            except BaseException:  # some layers may have grown, others not: start afresh next time
                self._prefix_cache, self._prefix_ids = None, []
                raise
            self.stats["forward_passes"] += 1
            self.stats["prefill_tokens"] += shared - keep
            self._prefix_ids = target
        return shared


def _preallocated_cache(config, capacity: int):
    """A DynamicCache whose layers write into buffers allocated once per batch. The default layer
    concatenates the whole cache at every new token, an O(length) copy per step and layer that
    costs more than the model itself at batch 8-16 with 1,700-token prompts."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def __init__(self):
            super().__init__()
            self.length = 0

        def lazy_initialization(self, key_states, value_states):
            super().lazy_initialization(key_states, value_states)
            b, h, _, d = key_states.shape
            self.key_buffer = key_states.new_empty((b, h, capacity, d))
            self.value_buffer = value_states.new_empty((b, h, capacity, value_states.shape[-1]))

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.key_buffer.shape[-2]:  # not expected: capacity covers prompt + budget
                grow = end + capacity
                self.key_buffer = _grow(self.key_buffer, grow, self.length)
                self.value_buffer = _grow(self.value_buffer, grow, self.length)
            self.key_buffer[:, :, self.length : end] = key_states
            self.value_buffer[:, :, self.length : end] = value_states
            self.length = end
            self._views()
            return self.keys, self.values

        def batch_select_indices(self, indices):
            if self.is_initialized:
                self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
                self._views()

        def crop(self, tokens_to_remove: int) -> None:
            if self.is_initialized and tokens_to_remove < 0:
                self.length = max(0, self.length + tokens_to_remove)
                self._views()

        def _views(self):
            self.keys = self.key_buffer[:, :, : self.length]
            self.values = self.value_buffer[:, :, : self.length]

    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer() for _ in cache.layers]
    return cache


def _grow(buffer, size: int, used: int):
    bigger = buffer.new_empty(buffer.shape[:2] + (size,) + buffer.shape[3:])
    bigger[:, :, :used] = buffer[:, :, :used]
    return bigger


# ---- helpers --------------------------------------------------------------------------------
def _invalid(req: GenerationRequest) -> str | None:
    if req.n < 1:
        return f"n must be >= 1, got {req.n}"
    if req.temperature < 0:
        return f"temperature must be >= 0, got {req.temperature}"
    if req.max_new_tokens < 0:
        return f"max_new_tokens must be >= 0, got {req.max_new_tokens}"
    return None


def _common_prefix_len(seqs: list[list[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return n


def _generator(row: _Row):
    import torch

    if row.temperature == 0 or row.seed is None:
        return None
    # Seeded per sample, so a request's samples do not depend on what it was batched with.
    return torch.Generator().manual_seed((row.seed * 1_000_003 + row.sample) % (2**63))


def _pick_tokens(logits, rows: list[_Row], generators):
    import torch

    greedy = logits.argmax(dim=-1)
    if all(r.temperature == 0 for r in rows):
        return greedy
    tokens = greedy.clone()
    for b, (row, gen) in enumerate(zip(rows, generators, strict=True)):
        if row.temperature > 0:
            probs = torch.softmax(logits[b].float() / row.temperature, dim=-1).cpu()
            tokens[b] = torch.multinomial(probs, 1, generator=gen).item()
    return tokens


def _resolve_device(device: str) -> str:
    import torch

    gpus = devices.gpu_count()  # the count every stage plans with (eval's `auto` too)
    if device == "auto":
        return "cuda" if gpus else "cpu"
    if device.startswith("cuda") and not gpus:
        raise PipelineError(f"llm.device: {device} asked for but no CUDA device is available; use device=cpu")
    index = device.partition(":")[2]
    if device.startswith("cuda") and index and int(index) >= gpus:
        # torch would fail at the first tensor moved there ("invalid device ordinal"), a traceback
        raise PipelineError(f"llm.device: {device} does not exist: this machine has {gpus} "
                            f"CUDA device(s), cuda:0 to cuda:{gpus - 1}; use one of them or device=auto")
    if device == "mps" and not torch.backends.mps.is_available():
        raise PipelineError("llm.device: mps asked for but this machine has no Apple GPU; use device=auto or cpu")
    return device


def _resolve_dtype(dtype: str, device):
    """auto: bf16 on a bf16 GPU or a CPU with native bf16, else fp32 (fp16 on older GPUs); see
    pipeline/core/precision.py. fp32 keeps batched greedy output identical to batch-1 output; bf16
    can flip an occasional token, against fp32 and across batch sizes (bench/bench_generate.py
    --parts precision reports how many trajectories stay identical)."""
    from pipeline.core import precision

    choice = precision.inference(dtype, device.type)
    print(choice.line("inference"), file=sys.stderr)
    return choice.torch_dtype


def _load_tokenizer(source: str, kwargs: dict, cfg: LLMConfig):
    tokenizer = load_tokenizer(source, key="llm.model", label=cfg.model,
                               trust_remote_code=cfg.trust_remote_code, **kwargs)
    tokenizer.padding_side = "left"
    return tokenizer


def _load_model(source: str, kwargs: dict, cfg: LLMConfig, dtype, device):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=cfg.trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        raise PipelineError(f"llm.model: cannot load model {cfg.model} ({_first_line(exc)})") from None
    return model.to(device)


def _apply_adapter(model, adapter: str):
    path = Path(adapter).expanduser()
    if not (path / "adapter_config.json").is_file():
        raise PipelineError(f"llm.adapter: {adapter} is not a PEFT adapter directory (no adapter_config.json)")
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(model, str(path))
    # LoRA folds into the weights: generation then costs what the base model costs.
    if peft_model.peft_config["default"].peft_type.value == "LORA":
        return peft_model.merge_and_unload()
    return peft_model


def _context_window(cfg: LLMConfig, model, tokenizer) -> int:
    if cfg.max_context:
        return int(cfg.max_context)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit:
        return int(limit)
    return int(min(tokenizer.model_max_length, 1 << 20))


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    # Raw-text prompting: a base-style end-of-document token ends the completion too.
    eod = tokenizer.convert_tokens_to_ids("<|endoftext|>") if "<|endoftext|>" in tokenizer.get_vocab() else None
    if isinstance(eod, int):
        ids.add(eod)
    return ids


def _plain_dynamic_cache(model) -> bool:
    """The prefix cache crops and expands plain KV layers; other cache kinds (sliding windows,
    linear attention) run without it."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:
        return False
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
