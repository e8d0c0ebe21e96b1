"""The in-process vLLM engine (`vllm.LLM`): prefix caching shares the few-shot exemplars across
episodes, tensor parallelism comes from config, a LoRA adapter is applied to every request.

    llm: {backend: vllm, model: meta-llama/Llama-3.1-8B-Instruct, tensor_parallel_size: 2}

vLLM pins its own torch, so it lives in its own environment: `bash scripts/setup_vllm.sh` makes
.venv-vllm (vLLM's CPU build where there is no GPU) with this project installed in it, and an
eval with this backend runs there: `.venv-vllm/bin/python -m pipeline eval model.backend=vllm ...`.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.llm.base import Completion, GenerationRequest, cut_at_stop
from pipeline.llm.config import LLMConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")


def import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise PipelineError(f"llm.backend=vllm needs vLLM, which is not installed here ({exc}); bash "
                            "scripts/setup_vllm.sh makes .venv-vllm: run the stage with .venv-vllm/bin/python "
                            "-m pipeline ... (or give the eval a `serve:` section)") from None
    return vllm


class VLLMBackend:
    """`LLM` backed by an in-process `vllm.LLM` engine."""

    def __init__(self, cfg: LLMConfig):
        if cfg.dtype not in DTYPES:
            raise PipelineError(f"llm.dtype: unknown dtype {cfg.dtype!r}; use one of {', '.join(DTYPES)}")
        self.vllm = import_vllm()
        self.cfg = cfg
        self.name = cfg.label
        self.engine = self.vllm.LLM(**engine_kwargs(cfg))
        self.lora = None
        if cfg.adapter:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, cfg.adapter)

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        results: list[list[Completion] | None] = [None] * len(requests)
        prompts, params, index = [], [], []
        limit = self._context_limit()
        for i, req in enumerate(requests):
            try:
                problem = self._too_long(req.prompt, limit)
                if problem is None:
                    params.append(sampling_params(self.vllm, req))
            except (ValueError, TypeError) as exc:  # vLLM validates its parameters
                problem = str(exc)
            if problem:
                results[i] = [_error(problem) for _ in range(max(req.n, 1))]
                continue
            prompts.append(req.prompt)
            index.append(i)
        if prompts:
            for i, out in zip(index, self._run(prompts, params), strict=True):
                results[i] = out if isinstance(out, list) else completions_from_output(out, requests[i])
        return results  # type: ignore[return-value]

    def _run(self, prompts: list[str], params: list) -> list[Any]:
        """One engine call for the batch; if vLLM rejects it, each prompt alone, so only the bad
        ones fail (the LLM contract: one bad request never sinks the others)."""
        kwargs = {"lora_request": self.lora} if self.lora is not None else {}
        try:
            return self.engine.generate(prompts, params, use_tqdm=False, **kwargs)
        except ValueError:  # raised while validating, before any generation
            pass
        outputs = []
        for prompt, p in zip(prompts, params, strict=True):
            try:
                outputs.append(self.engine.generate([prompt], [p], use_tqdm=False, **kwargs)[0])
            except ValueError as exc:
                outputs.append([_error(str(exc)) for _ in range(p.n)])
        return outputs

    def close(self) -> None:
        """Shut the engine down now, not at interpreter exit: its worker processes and the
        memory they hold (weights, KV cache: `gpu_memory_utilization` of each GPU) go with it.
        The V1 engine runs its core in a child process (LLM.llm_engine.engine_core.shutdown());
        then vLLM's own cleanup of the distributed state and the CUDA cache."""
        engine, self.engine = self.engine, None
        if engine is None:
            return
        core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
        if callable(getattr(core, "shutdown", None)):
            core.shutdown()
        del engine, core
        import gc

        gc.collect()
        try:
            from vllm.distributed import cleanup_dist_env_and_memory
        except ImportError:  # an older vLLM without it: the process exit frees the rest
            return
        cleanup_dist_env_and_memory()

    def _context_limit(self) -> int | None:
        engine = getattr(self.engine, "llm_engine", None)
        return getattr(getattr(engine, "model_config", None), "max_model_len", None)

    def _too_long(self, prompt: str, limit: int | None) -> str | None:
        if not limit:
            return None
        n = len(self.engine.get_tokenizer().encode(prompt))
        return f"context window exceeded: {n} > {limit} tokens" if n > limit else None


def engine_kwargs(cfg: LLMConfig) -> dict[str, Any]:
    from pipeline.hub.models import resolve_model_path

    kwargs: dict[str, Any] = {
        "model": resolve_model_path(cfg.model),
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "enable_prefix_caching": True,  # every prompt starts with the same exemplars
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "dtype": cfg.dtype,
        "trust_remote_code": cfg.trust_remote_code,
    }
    if cfg.max_context:
        kwargs["max_model_len"] = cfg.max_context
    if cfg.adapter:
        from pathlib import Path

        from pipeline.llm.serving import max_lora_rank

        # vLLM's default max_lora_rank (16) refuses a larger adapter: the 70B student's is r=64.
        kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank(Path(cfg.adapter)))
    kwargs.update(cfg.extra)  # e.g. max_lora_rank, enforce_eager, quantization
    return kwargs


def sampling_params(vllm, req: GenerationRequest):
    return vllm.SamplingParams(n=req.n, temperature=req.temperature, max_tokens=req.max_new_tokens,
                               stop=list(req.stop), seed=req.seed)


def _error(message: str) -> Completion:
    return Completion("", 0, 0, "error", message)


def completions_from_output(out, req: GenerationRequest) -> list[Completion]:
    """vLLM already cuts at the stop string (excluded); cutting again is a no-op kept for safety
    with engines that include it."""
    prompt_tokens = len(out.prompt_token_ids or [])
    completions = []
    for o in out.outputs:
        text, _ = cut_at_stop(o.text, req.stop)
        finish = "length" if o.finish_reason == "length" else "stop"
        completions.append(Completion(text, prompt_tokens, len(o.token_ids), finish))
    return completions
