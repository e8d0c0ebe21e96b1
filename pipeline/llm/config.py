"""How a config names a language model. `pipeline.llm.factory.load_llm(cfg)` builds it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LLMConfig:
    # transformers: local dir / hub id / .gguf file ("smollm2" = the embedded SmolLM2-135M-Instruct);
    # vllm: hub id or dir; openai: the served model name.
    backend: str = "transformers"  # transformers | vllm | openai
    model: str = "smollm2"
    gguf_file: str | None = None  # a GGUF file inside `model` (a directory)
    adapter: str | None = None  # a PEFT adapter directory applied on top of `model`
    name: str | None = None  # label in outputs; defaults to the model
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_batch_size: int = 16  # transformers: sequences per generate() call
    max_context: int | None = None  # tokens; None = the model's own limit
    trust_remote_code: bool = False  # only when asked: it executes code shipped with the model
    # vllm
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    # openai-compatible HTTP (vllm serve, TGI, hosted endpoints)
    base_url: str | list[str] = "http://127.0.0.1:8000/v1"  # or a list: replicas of one model
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this variable, never from config
    mode: str = "completions"  # completions | chat
    max_concurrency: int = 8  # requests in flight at once, per replica
    timeout_s: float = 60.0
    max_retries: int = 5
    extra: dict = field(default_factory=dict)  # backend-specific passthrough (e.g. vllm kwargs)
    # backend oracle (the stand-in teacher) only: exact | agent (pipeline.tasks.hotpotqa.oracle)
    oracle_style: str = "exact"

    @property
    def label(self) -> str:
        return self.name or self.model
