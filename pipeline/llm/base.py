"""One interface for every language model the pipeline prompts or evaluates.

A backend turns a batch of requests (prompt, stop strings, sampling settings) into completions.
Batching is the backend's business: the agent runner hands it every episode that is waiting, in
rounds. A backend that declares `continuous_batching = True` (its server batches requests as they
arrive) is instead called once per episode, from several threads at once (pipeline.agent.scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# Every backend samples with the temperature alone, over the whole distribution (hf.py's softmax,
# vLLM's SamplingParams defaults): each other knob at its neutral value. A vLLM server fills a knob
# a request leaves out from the model's generation_config.json (user -> server default -> OpenAI
# default: vllm/entrypoints/openai/completion/protocol.py, to_sampling_params; Llama-3.1's sets
# top_p 0.9, Qwen2.5's top_k 20 and repetition_penalty 1.05, even for greedy requests), so the
# OpenAI-compatible client sends them (pipeline/llm/openai_http.py) and manifests record them.
OPENAI_SAMPLING = {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}  # the OpenAI API's own
# vLLM's further knobs, sent only to a vLLM server (a hosted API refuses unknown fields); top_k -1
# means off in every vLLM release (0.32 takes 0 too, older ones only -1)
VLLM_SAMPLING = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


def sampling_fields(llm) -> dict:
    """The sampling knobs besides the temperature that `llm` samples with: what an OpenAI-compatible
    backend sends (it knows its server), else the neutral values of the in-process backends."""
    sent = getattr(llm, "sampling_fields", None)
    return sent() if callable(sent) else {**OPENAI_SAMPLING, **VLLM_SAMPLING}


@dataclass
class GenerationRequest:
    prompt: str
    stop: list[str] = field(default_factory=list)
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    n: int = 1  # samples per prompt (CoT-SC uses 21 at T=0.7)
    seed: int | None = None
    # A chat request (prompting.interface: tools): the conversation so far in OpenAI's wire format
    # and the tools' JSON schemas, in place of `prompt` (pipeline/core/messages.py writes both)
    messages: list[dict] | None = None
    tools: list[dict] | None = None


@dataclass
class Completion:
    text: str  # cut before the first stop string (the stop string itself excluded)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # "stop" (hit a stop string / EOS), "length", or "error"
    error: str | None = None  # why, when finish_reason == "error" (e.g. context window exceeded)
    tool_calls: list[dict] | None = None  # a chat request's answer: the tool calls as the server sent them


class LLM(Protocol):
    name: str

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """For each request, `n` completions. Must not raise for one bad request: report it as
        a Completion with finish_reason="error" so the other episodes go on."""


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut `text` before the earliest stop string; report whether one was found."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if s and i != -1 and i < cut:
            cut = i
    return text[:cut], cut < len(text)
