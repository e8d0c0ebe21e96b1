"""The policy as a generator of token ids: the model being trained, asked mid-training.

Two engines, chosen by `rollout.engine`:

- `transformers` (CPU, and any GPU): the project's own decoding loop (pipeline.llm.hf:
  per-row stop strings, a shared-prefix KV cache, seeded sampling) run over the trainer's model
  as it is at this step, inside TRL's `unwrap_model_for_generation` (DDP unwrapped, ZeRO-3
  parameters gathered, gradient checkpointing off while generating); under bf16 training its
  weights cast to bf16 for the batch (`sampling_weights`). A request carries its context as
  token ids (pipeline.rl.trace) and its completion carries the sampled ids back. Each call
  re-reads every episode's whole context (no KV cache is kept from one environment step to the
  next: see docs/grpo.md, "Rollouts and the update on a CPU").
- `vllm` (GPUs): TRL's own vLLM engine, colocated or a `trl vllm-serve` server (TRL syncs the
  weights before each rollout); each request is one SamplingParams call with the step's stop
  strings. Written against TRL 1.16's VLLMGeneration; not run here (no GPU, no vLLM).

Each request's sampling seed is fixed by the run seed, the optimizer step and the rollout's
place in the step's batch, so a resumed run samples the same rollouts as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.llm.base import Completion, GenerationRequest
from pipeline.llm.config import LLMConfig
from pipeline.llm.hf import TransformersLLM

ENGINES = ("transformers", "vllm")


@dataclass
class TokenRequest(GenerationRequest):
    prompt_ids: list[int] = field(default_factory=list)  # the context, exactly (prompt = its text)


@dataclass
class TokenCompletion(Completion):
    token_ids: list[int] = field(default_factory=list)  # sampled, up to the stop string (EOS excluded)
    token_logprobs: list[float | None] | None = None  # the engine's log-probability of each (vLLM gives them)


class PolicyLLM(TransformersLLM):
    """pipeline.llm.hf's decoding, from token ids, returning token ids."""

    def _prompt_ids(self, req: GenerationRequest) -> list[int]:
        return list(req.prompt_ids)  # type: ignore[attr-defined]

    def _completion(self, row) -> Completion:
        return TokenCompletion(**asdict(super()._completion(row)), token_ids=list(row.generated))


@contextlib.contextmanager
def transformers_policy(trainer: Any, max_batch_size: int, max_context: int | None, llm_class=None,
                        sample_dtype: str = "fp32"):
    """A PolicyLLM (or `llm_class`: TransformersLLM for text prompts) over the trainer's current
    weights, for one rollout batch, in `sample_dtype` (bf16: a bf16 copy of the fp32 weights, made
    once for the batch; fp32: the weights as they are). Built afresh each time: its prefix cache
    holds keys and values of these weights only."""
    from trl.models import unwrap_model_for_generation

    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                     gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                                     gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
                                     ) as model, without_cpu_autocast(model), sampling_weights(model, sample_dtype):
        was_training = model.training
        model.eval()  # no dropout while sampling
        try:
            cfg = LLMConfig(model="policy", max_batch_size=max_batch_size, max_context=max_context)
            yield (llm_class or PolicyLLM).from_loaded(cfg, model, trainer.processing_class)
        finally:
            model.train(was_training)


@contextlib.contextmanager
def without_cpu_autocast(model):
    """On a CPU, sample without accelerate's bf16 autocast. Under bf16 mixed precision accelerate
    wraps the model's forward in autocast, which re-casts every weight to bf16 at every forward, a
    large share of token-by-token decoding (bench/bench_rollout_autocast.py, SmolLM2-135M, one
    thread of this 2-core Xeon, load 4.6: fp32 weights without it gave 1.3x the tokens/s at batch
    8; 2.4x at batch 2). The weights are then cast once per batch instead (`sampling_weights`), or
    sampled in fp32 (rollout.precision fp32). The update still runs under autocast; its old
    log-probabilities are its own (TRL: on-policy)."""
    original = model.__dict__.get("_original_forward")  # set by accelerate's prepare_model
    if original is None or model.device.type != "cpu":
        yield
        return
    patched = model.forward
    model.forward = original
    try:
        yield
    finally:
        model.forward = patched


@contextlib.contextmanager
def sampling_weights(model, sample_dtype: str):
    """The model's fp32 parameters cast to bf16 for the batch (`sample_dtype` "bf16"), put back
    after it: the optimizer's parameters stay the same objects with the same fp32 values, only
    their `.data` is swapped while sampling. Buffers (RoPE's inverse frequencies) stay fp32, as
    in a model loaded in bf16. Why: token-by-token decoding of fp32 weights under bf16 autocast
    re-casts every weight at every forward, and fp32 decoding reads twice the bytes of bf16; one
    cast per batch samples from the bf16 rounding of the same weights that the bf16-autocast
    update computes with (bench/bench_grpo_step.py measures the gain)."""
    import torch

    if sample_dtype == "fp32":
        yield
        return
    if sample_dtype != "bf16":
        raise ValueError(f"sample_dtype: {sample_dtype!r} is not bf16 or fp32")
    kept = []
    with torch.no_grad():
        for param in model.parameters():  # tied weights (embeddings and LM head) come once
            if param.dtype == torch.float32:
                kept.append((param, param.data))
                param.data = param.data.to(torch.bfloat16)
    try:
        yield
    finally:
        for param, data in kept:
            param.data = data


@contextlib.contextmanager
def vllm_policy(trainer: Any, max_context: int | None):
    """A VLLMPolicy for one rollout batch, with a colocated engine's sleep mode handled as TRL's
    own VLLMGeneration.generate does around its llm.generate: TRL's sync_weights wakes only the
    weights, and vLLM resumes its scheduler only once all of its memory is awake (v1/engine/core.py,
    EngineCore.wake_up), so a generate with the KV cache still asleep would queue its requests and
    wait for ever. So: weights re-pushed where level-2 sleep discarded them (a second batch in one
    step), the KV cache woken for the whole batch (every round of the episodes: re-pushing weights
    between rounds would be a collective that ranks with different round counts cannot match),
    and all memory put back to sleep (level 2) after it."""
    generation = trainer.vllm_generation
    sleeps = generation.mode == "colocate" and getattr(generation, "enable_sleep_mode", False)
    if sleeps:
        if generation._llm_weights_sleeping:
            generation.sync_weights()
        generation.llm.wake_up(tags=["kv_cache"])
    try:
        yield VLLMPolicy(trainer, max_context)
    finally:
        if sleeps:
            generation.llm.sleep(level=2)
            generation._llm_weights_sleeping = True  # TRL's flag: the next batch re-pushes the weights (above)


class VLLMPolicy:
    """TRL's vLLM engine (trainer.vllm_generation) as a token-id generator. Colocate mode: each
    process asks its own engine, one SamplingParams per request (stop strings and seeds differ).
    Server mode: every process's requests are gathered, rank 0 asks the server once per distinct
    (stop strings, budget, temperature), the answers are broadcast back, as TRL's own
    VLLMGeneration.generate does; the server takes no per-request seed there, so a resumed run
    does not re-sample the same rollouts. Every process must then call generate() in every round
    (`collective`), with no requests when it has none. Not run here: written against TRL 1.16."""

    name = "policy (vllm)"

    def __init__(self, trainer: Any, max_context: int | None = None):
        self.trainer, self.generation = trainer, trainer.vllm_generation
        self.tokenizer, self.max_context = trainer.processing_class, max_context
        self.collective = self.generation.mode == "server"

    def generate(self, requests: list[TokenRequest]) -> list[list[Completion]]:
        """As the transformers engine: a context over `max_context` ends its episode
        (context_exceeded) instead of reaching vLLM, which would refuse the whole batch; the
        others' budgets stop at it."""
        fits = [r for r in requests if self.max_context is None or len(r.prompt_ids) < self.max_context]
        if self.max_context is not None:
            for r in fits:
                r.max_new_tokens = min(r.max_new_tokens, self.max_context - len(r.prompt_ids))
        outputs = iter(self._server(fits) if self.collective else self._colocate(fits))
        fitting = {id(r) for r in fits}
        return [[self._completion(r, *next(outputs)) if id(r) in fitting else self._too_long(r)] for r in requests]

    def _too_long(self, req: TokenRequest) -> Completion:
        return TokenCompletion("", len(req.prompt_ids), 0, "error",
                               f"context window exceeded: {len(req.prompt_ids)} >= {self.max_context} tokens")

    def _colocate(self, requests: list[TokenRequest]) -> list[tuple[list[int], list[float | None]]]:
        """(token ids, the sampled tokens' log-probabilities) of each request. TRL builds the
        colocated engine with logprobs_mode="processed_logprobs" (after temperature), the
        distribution the loss's log-probabilities are compared with."""
        from vllm import SamplingParams

        if not requests:
            return []
        params = [SamplingParams(n=1, temperature=r.temperature, max_tokens=r.max_new_tokens, stop=r.stop,
                                 include_stop_str_in_output=True, seed=r.seed, logprobs=0) for r in requests]
        outs = self.generation.llm.generate([{"prompt_token_ids": r.prompt_ids} for r in requests],
                                            sampling_params=params, use_tqdm=False)
        return [sampled_logprobs(out.outputs[0]) for out in outs]

    def _server(self, requests: list[TokenRequest]) -> list[tuple[list[int], list[float | None]]]:
        from accelerate.utils import broadcast_object_list, gather_object

        mine = [(r.prompt_ids, tuple(r.stop), r.max_new_tokens, r.temperature) for r in requests]
        every = gather_object([mine])  # one list per process, in rank order
        answers: list = [None]
        if self.trainer.accelerator.is_main_process:
            flat = [req for part in every for req in part]
            ids: list = [None] * len(flat)
            groups: dict = {}
            for k, (_, stop, budget, temperature) in enumerate(flat):
                groups.setdefault((stop, budget, temperature), []).append(k)
            for (stop, budget, temperature), members in groups.items():
                out = self.generation.vllm_client.generate(
                    prompts=[flat[k][0] for k in members], n=1, temperature=temperature, max_tokens=budget,
                    logprobs=0, generation_kwargs={"stop": list(stop), "include_stop_str_in_output": True})
                # logprobs=0: one entry per token, the sampled token's (TRL's client, shape [seq][token][1])
                for k, completion, logprobs in zip(members, out["completion_ids"], out["logprobs"], strict=True):
                    ids[k] = (completion, [lp[0] for lp in logprobs])
            offsets = [0]
            for part in every:
                offsets.append(offsets[-1] + len(part))
            answers = [[ids[offsets[i]:offsets[i + 1]] for i in range(len(every))]]
        broadcast_object_list(answers, from_process=0)
        return answers[0][self.trainer.accelerator.process_index]

    def any_active(self, active: bool) -> bool:
        """Whether any process still has an episode waiting (server mode's rounds are collective)."""
        from accelerate.utils import gather_object

        return any(gather_object([active]))

    def _completion(self, req: TokenRequest, ids: list[int], logprobs: list[float | None]) -> Completion:
        from pipeline.llm.base import cut_at_stop

        ended = bool(ids) and ids[-1] == self.tokenizer.eos_token_id
        ids, logprobs = (ids[:-1], logprobs[:-1]) if ended else (list(ids), list(logprobs))
        text, stopped = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), req.stop)
        finish = "length" if not (stopped or ended) and len(ids) >= req.max_new_tokens else "stop"
        return TokenCompletion(text, len(req.prompt_ids), len(ids), finish, token_ids=ids, token_logprobs=logprobs)


def sampled_logprobs(output) -> tuple[list[int], list[float | None]]:
    """A vLLM CompletionOutput's token ids and each sampled token's log-probability (None where
    vLLM gave NaN: TRL then applies no correction at that token)."""
    import math

    ids = list(output.token_ids)
    if output.logprobs is None:
        raise RuntimeError("vLLM returned no logprobs although they were asked for (SamplingParams(logprobs=0))")
    values = [step[token].logprob for token, step in zip(ids, output.logprobs, strict=True)]
    return ids, [None if math.isnan(v) else v for v in values]
