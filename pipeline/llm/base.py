"""One interface for every language model the pipeline prompts or evaluates.

A backend turns a batch of requests (prompt, stop strings, sampling settings) into completions.
Batching is the backend's business: the agent runner hands it every episode that is waiting, in
rounds. A backend that declares `continuous_batching = True` (its server batches requests as they
arrive) is instead called once per episode, from several threads at once (pipeline.agent.scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class GenerationRequest:
    prompt: str
    stop: list[str] = field(default_factory=list)
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    n: int = 1  # samples per prompt (CoT-SC uses 21 at T=0.7)
    seed: int | None = None


@dataclass
class Completion:
    text: str  # cut before the first stop string (the stop string itself excluded)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # "stop" (hit a stop string / EOS), "length", or "error"
    error: str | None = None  # why, when finish_reason == "error" (e.g. context window exceeded)


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
