"""Build the language model a config names.

    from pipeline.llm.factory import load_llm
    llm = load_llm(LLMConfig(backend="transformers", model="smollm2"))
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.llm.base import LLM
from pipeline.llm.config import LLMConfig

BACKENDS = ("transformers", "vllm", "openai")


def load_llm(cfg: LLMConfig) -> LLM:
    """The backend named by cfg.backend; heavy libraries are imported only for the one chosen."""
    if cfg.backend not in BACKENDS:
        raise PipelineError(f"llm.backend: unknown backend {cfg.backend!r}; valid: {', '.join(BACKENDS)}")
    if cfg.backend == "openai":
        from pipeline.llm.openai_http import OpenAICompatibleLLM

        return OpenAICompatibleLLM(cfg)
    _require_local_files(cfg)  # fail before importing torch or vLLM
    if cfg.backend == "transformers":
        from pipeline.llm.hf import TransformersLLM

        return TransformersLLM(cfg)
    from pipeline.llm.vllm_backend import VLLMBackend

    return VLLMBackend(cfg)


def _require_local_files(cfg: LLMConfig) -> None:
    """A model written as a path must exist (a hub id is left to the loader), and so must the adapter."""
    from pipeline.hub.models import looks_like_path

    if looks_like_path(cfg.model) and not Path(cfg.model).expanduser().exists():
        raise PipelineError(f"llm.model: model path {cfg.model} not found; give an existing directory or .gguf file, a hub id, or 'smollm2'")
    if cfg.adapter and not Path(cfg.adapter).expanduser().is_dir():
        raise PipelineError(f"llm.adapter: adapter directory {cfg.adapter} not found; give a PEFT adapter directory or remove llm.adapter")


