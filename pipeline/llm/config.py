"""How a config names a language model. `pipeline.llm.factory.load_llm(cfg)` builds it."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import ClassVar

from pipeline.core.config import bound, check, in_range
from pipeline.core.same_run import same_run

DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")  # what the transformers backend places a model on


def device_problem(device: str) -> str | None:
    """A device the transformers backend cannot place a model on (torch.device raised a traceback
    for `tpu`); whether a CUDA device is there is checked when the model loads (pipeline/llm/hf.py)."""
    if DEVICE.fullmatch(str(device)):
        return None
    return f"must be auto, cpu, cuda, cuda:N or mps; got {device!r}"


@dataclass
class LLMConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"mode": "api"}  # old key -> new (pipeline.core.config)
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "oracle_style": "the stand-in teacher is no LLM backend; its search style is the stage's own key: "
                        "use oracle=agent (or oracle=exact) in generate or eval"}
    # vLLM's and transformers' names of our keys: their did-you-mean (pipeline.core.config)
    SYNONYMS: ClassVar[dict[str, tuple[str, str]]] = {
        "max_model_len": ("max_context", "vLLM's"), "torch_dtype": ("dtype", "transformers'"),
        "model_name_or_path": ("model", "transformers'"), "device_map": ("device", "transformers'")}

    # transformers: local dir / hub id / .gguf file ("smollm2" = the embedded SmolLM2-135M-Instruct);
    # vllm: hub id or dir; openai: the served model name.
    backend: str = same_run("identity", default="transformers")  # transformers | vllm | openai
    model: str = same_run("identity", default="smollm2")
    gguf_file: str | None = same_run("identity", default=None)  # a GGUF file inside `model` (a directory)
    adapter: str | None = same_run("identity", default=None)  # a PEFT adapter directory applied on top of `model`
    name: str | None = same_run("identity", default=None)  # label in outputs; defaults to the model
    dtype: str = same_run("identity", default="auto")  # auto | float32 | bfloat16 | float16
    device: str = same_run("free", default="auto", metadata=check(device_problem))  # auto | cpu | cuda | cuda:N
    max_batch_size: int = same_run("free", default=16, metadata=bound(1))  # transformers: sequences per generate() call
    max_context: int | None = same_run("identity", default=None, metadata=bound(1))  # tokens; None = the model's own limit
    trust_remote_code: bool = same_run("identity", default=False)  # only when asked: it executes code shipped with the model
    # vllm
    tensor_parallel_size: int = same_run("identity", default=1, metadata=bound(1))
    gpu_memory_utilization: float = same_run("identity", default=0.9, metadata=check(in_range(0, 1, above=True)))  # vLLM's share of each GPU
    # openai-compatible HTTP (vllm serve, TGI, hosted endpoints)
    base_url: str | list[str] = same_run("free", default="http://127.0.0.1:8000/v1")  # or a list: replicas of one model
    api_key_env: str = same_run("identity", default="OPENAI_API_KEY")  # the key is read from this variable, never from config
    api: str = same_run("identity", default="completions")  # completions | chat: the server's endpoint
    # Requests in flight at once, per replica. None: the stage's max_in_flight (one knob for the
    # episodes, the HTTP pool and a managed server's --max-num-seqs: with_episodes_in_flight); a
    # value set here caps the requests whatever max_in_flight says (a hosted API's rate limit)
    max_concurrency: int | None = same_run("free", default=None, metadata=bound(1))
    timeout_s: float = same_run("free", default=60.0, metadata=check(in_range(0, above=True)))
    max_retries: int = same_run("free", default=5, metadata=bound(0))
    # How long to wait for an external endpoint to come up before the first request: a `vllm serve`
    # started just before (`&`) loads the 405B for ~10 min; 0 = fail at once when it does not answer.
    ready_timeout_s: float = same_run("free", default=1800.0, metadata=check(in_range(0)))
    extra: dict = same_run("identity", default_factory=dict)  # backend-specific passthrough (e.g. vllm kwargs)

    def __post_init__(self):
        if self.backend == "oracle":
            raise ValueError("backend 'oracle' is refused: the oracle is a stand-in teacher, not a language-model "
                             "backend: set `oracle: exact` (or agent) in generate (or eval), not the model's backend")

    @property
    def label(self) -> str:
        return self.name or self.model


# The HTTP backend's requests in flight where no stage says how many episodes are (a backend built
# directly, as the benchmarks and tests do): a stage's max_in_flight sets it otherwise.
UNSTAGED_CONCURRENCY = 8


def with_episodes_in_flight(llm: LLMConfig, max_in_flight: int) -> LLMConfig:
    """`llm` with its requests in flight following the stage's episodes in flight (each episode
    has one request out at a time: pipeline.agent.scheduler), unless the config sets its own."""
    return llm if llm.max_concurrency is not None else replace(llm, max_concurrency=max_in_flight)
