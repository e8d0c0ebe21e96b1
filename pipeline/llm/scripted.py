"""A scripted language model for offline tests of the agent and the methods.

    llm = ScriptedLLM(lambda prompt, request: " I should search X.\\nAction 1: Search[X]\\nObservation 1: ...")
    llm = ScriptedLLM([" first answer", " second answer"])   # canned outputs, in call order

Like a real model, the text it returns is cut before the request's first stop string, and text
longer than `max_new_tokens` (whitespace words count as tokens) is cut there with
finish_reason "length", so an agent test sees what a backend would hand it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipeline.llm.base import Completion, GenerationRequest, cut_at_stop

Responder = Callable[[str, GenerationRequest], str]


class ScriptedLLM:
    """`LLM` whose outputs come from `responder(prompt, request) -> str` or a list of canned
    outputs (one per completion, consumed in order; running out is an error completion)."""

    def __init__(self, responder: Responder | Sequence[str], name: str = "scripted"):
        self.name = name
        if callable(responder):
            self._respond: Responder = responder
        else:
            canned = list(responder)
            self._respond = lambda prompt, request: canned.pop(0) if canned else _exhausted()
        self.calls = 0  # generate() calls
        self.batch_sizes: list[int] = []  # requests per call
        self.prompts: list[str] = []  # every prompt seen, in order

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        self.calls += 1
        self.batch_sizes.append(len(requests))
        return [[self._complete(req) for _ in range(req.n)] for req in requests]

    def _complete(self, request: GenerationRequest) -> Completion:
        self.prompts.append(request.prompt)
        try:
            raw = self._respond(request.prompt, request)
        except _Exhausted:
            return Completion("", _count(request.prompt), 0, "error", "scripted outputs exhausted")
        text, _ = cut_at_stop(raw, request.stop)
        words = text.split(" ")
        if _count(text) > request.max_new_tokens:  # runaway text: cut at the budget, as a model would
            kept, n = [], 0
            for w in words:
                n += bool(w.strip())
                if n > request.max_new_tokens:
                    break
                kept.append(w)
            return Completion(" ".join(kept), _count(request.prompt), request.max_new_tokens, "length")
        return Completion(text, _count(request.prompt), _count(text), "stop")


class _Exhausted(Exception):
    pass


def _exhausted() -> str:
    raise _Exhausted


def _count(text: str) -> int:
    """Whitespace words stand in for tokens."""
    return len(text.split())
