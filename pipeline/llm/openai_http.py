"""An OpenAI-compatible HTTP endpoint as the teacher or student: `vllm serve`, TGI, a hosted API.

    llm:
      backend: openai
      base_url: http://127.0.0.1:8000/v1   # where `vllm serve MODEL` listens (or a list of
                                             # replicas: pipeline.llm.replicas)
      model: meta-llama/Llama-3.1-70B-Instruct
      api: completions                       # or chat (one user message per prompt); a request
                                             # with messages and tools (prompting.interface: tools)
                                             # goes to chat/completions either way
      api_key_env: OPENAI_API_KEY            # the key is read from this variable only
      max_concurrency: 8                     # default: the stage's max_in_flight

A PEFT adapter (`adapter:`) is refused: the server applies one only to requests that name it,
and `eval`'s `serve:` section serves it under a name and sends that name (pipeline/llm/serving.py).
Each request is one HTTP call (`n` samples in one call); up to `max_concurrency` calls are in
flight at once to each replica (each base URL): by default as many as the stage's episodes in
flight (`max_in_flight`, pipeline.llm.config.with_episodes_in_flight). A call that still fails after its retries (and
on the other replicas) becomes `n` completions with finish_reason="error" and the reason, so
the other episodes go on. Stop strings are sent to the server and applied again here, because
not every server honours them (or all of them). Every sampling knob is sent at its neutral value
(pipeline.llm.base.OPENAI_SAMPLING; vLLM's own, VLLM_SAMPLING, to a replica whose /models says it
is vLLM), so that no server fills one in from the model's generation_config.json.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.core.transport import JsonHttpClient, RequestFailed, TransientPayload
from pipeline.llm.base import (
    OPENAI_SAMPLING,
    VLLM_SAMPLING,
    Completion,
    GenerationRequest,
    cut_at_stop,
)
from pipeline.llm.config import UNSTAGED_CONCURRENCY, LLMConfig
from pipeline.llm.replicas import ReplicaSet

APIS = ("completions", "chat")
READY_POLL_S = 2.0  # how often a server still loading is asked again (check_available)
READY_PROGRESS_S = 30.0  # how often the wait for it says so


class OpenAICompatibleLLM:
    """The `LLM` protocol over POST {base_url}/completions or /chat/completions."""

    # The server batches requests as they arrive (vLLM, llama-server): the agent runner sends each
    # episode's next request as soon as its last one is back (pipeline.agent.scheduler.schedule_for).
    continuous_batching = True

    def __init__(self, cfg: LLMConfig, *, backoff_base_s: float = 0.5,
                 backoff_max_s: float = 30.0, sleep: Callable[[float], None] = time.sleep):
        """`backoff_*` and `sleep` shape the retry schedule (tests shrink it)."""
        if cfg.api not in APIS:
            raise PipelineError(f"llm.api '{cfg.api}' is unknown; use one of {list(APIS)}")
        base_urls = replica_urls(cfg.base_url)
        concurrency = UNSTAGED_CONCURRENCY if cfg.max_concurrency is None else cfg.max_concurrency
        if concurrency < 1:
            raise PipelineError(f"llm.max_concurrency must be >= 1, got {concurrency}")
        if cfg.adapter:  # a request names one served model; sending the base's name would score the base
            raise PipelineError(
                f"llm.adapter={cfg.adapter}: an OpenAI-compatible server applies an adapter only when a "
                f"request names it, and this would send the base model '{cfg.model}' and score it as the "
                "fine-tuned one; add a `serve:` section to the eval config instead: the pipeline then runs "
                "`vllm serve BASE --enable-lora --lora-modules NAME=ADAPTER` and sends NAME")
        self.name = cfg.label
        self.model = cfg.model
        self.api = cfg.api
        self.replicas = ReplicaSet(base_urls, concurrency)
        self.api_key_env = cfg.api_key_env
        self.max_concurrency = concurrency
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        schedule = {"backoff_base_s": backoff_base_s, "backoff_max_s": backoff_max_s,
                    "sleep": sleep, "headers": headers, "secrets": [key]}
        self.client = JsonHttpClient(timeout_s=cfg.timeout_s, max_retries=cfg.max_retries,
                                     **schedule)
        # The availability check must answer fast: one attempt per poll, not the generation
        # schedule; waiting for a server still loading is check_available's own loop.
        self._probe = JsonHttpClient(timeout_s=min(cfg.timeout_s, 10.0), max_retries=0,
                                     **schedule)
        self.ready_timeout_s = cfg.ready_timeout_s
        self._sleep = sleep
        self._has_key = bool(key)
        self._vllm: set[str] = set()  # the replicas whose /models says they are vLLM (check_available)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:  # the key lives only inside the clients' headers
        urls = [r.url for r in self.replicas.replicas]
        return (f"OpenAICompatibleLLM(model={self.model!r}, base_url={urls if len(urls) > 1 else urls[0]!r}, "
                f"api={self.api!r}, key_from=${self.api_key_env})")

    # -- the LLM protocol -------------------------------------------------------------------

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        if not requests:
            return []
        return list(self._executor().map(self._generate_one, requests))

    def check_available(self) -> None:
        """Raise PipelineError (one line) unless every replica answers and serves `model`; a
        replica that does not answer yet (connection refused, a timeout, HTTP 5xx: a server still
        loading) is waited for up to `ready_timeout_s`, with a progress line every
        READY_PROGRESS_S."""
        for replica in self.replicas.replicas:
            self._check_replica(replica.url, self.replicas.name(replica))

    def _check_replica(self, base_url: str, name: str) -> None:
        url = f"{base_url}/models"
        where = "" if name == base_url else f"{name}: "
        try:
            payload = self._wait_for_answer(url)
        except RequestFailed as e:
            hint = ""
            if "HTTP 401" in e.reason or "HTTP 403" in e.reason:
                hint = f" (the key from ${self.api_key_env} was {'refused' if self._has_key else 'not set'})"
            waited = (f" (waited {self.ready_timeout_s:g} s, llm.ready_timeout_s)"
                      if e.exhausted and self.ready_timeout_s > 0 else "")
            raise PipelineError(f"OpenAI-compatible endpoint unavailable: {where}{e.reason}{waited}{hint}; "
                                "start the server or fix llm.base_url / llm.api_key_env") from None
        models = payload.get("data") if isinstance(payload, dict) else None
        served = [m.get("id") for m in models if isinstance(m, dict)] \
            if isinstance(models, list) else []
        if self.model not in served:
            raise PipelineError(f"model '{self.model}' is not served by {name} "
                                f"(it serves {served[:10]}); fix llm.model")
        if any(m.get("id") == self.model and m.get("owned_by") == "vllm" for m in models):
            self._vllm.add(base_url)

    def sampling_fields(self) -> dict:
        """The sampling knobs besides the temperature sent to every replica."""
        every_vllm = all(r.url in self._vllm for r in self.replicas.replicas)
        return {**OPENAI_SAMPLING, **(VLLM_SAMPLING if every_vllm else {})}

    def _wait_for_answer(self, url: str) -> Any:
        """GET `url` until it answers, for up to `ready_timeout_s`; a failure not worth waiting
        for (HTTP 401, 404: the server is up and says no) is raised at once."""
        started = time.monotonic()
        last_note = None
        while True:
            try:
                payload = self._probe.get_json(url)
            except RequestFailed as e:
                waited = time.monotonic() - started
                if not e.exhausted or waited >= self.ready_timeout_s:
                    raise
                if last_note is None or waited - last_note >= READY_PROGRESS_S:
                    print(f"[endpoint] waiting for {url} to answer: {waited:.0f} s of "
                          f"{self.ready_timeout_s:g} s (llm.ready_timeout_s); last: {e.reason}", flush=True)
                    last_note = waited
                self._sleep(min(READY_POLL_S, max(self.ready_timeout_s - waited, 0.0)))
                continue
            if last_note is not None:
                print(f"[endpoint] {url} answered after {time.monotonic() - started:.0f} s", flush=True)
            return payload

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    # -- one request --------------------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        # One pool per backend, so max_concurrency bounds all calls even across generate()s.
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency * len(self.replicas),
                                                thread_name_prefix="openai-http")
            return self._pool

    def _generate_one(self, request: GenerationRequest) -> list[Completion]:
        """Send the request to the least busy replica; when that replica fails for good (not
        the request itself: a 4xx is the request's fault) try each other replica that is up."""
        tried: dict[str, str] = {}
        while True:
            replica = self.replicas.acquire(avoid=set(tried))
            url, body = self._request_body(request, replica.url)
            try:
                payload = self.client.post_json(url, body, check=_check_choices)
            except RequestFailed as e:
                self.replicas.release(replica, e.reason if e.exhausted else None)
                if len(self.replicas) == 1:
                    return _failed(request, e.reason)
                tried[replica.url] = f"{self.replicas.name(replica)}: {e.reason}"
                if e.exhausted and self.replicas.others_up(set(tried)):
                    continue
                return _failed(request, "; ".join(tried.values()))
            self.replicas.release(replica)
            break
        try:
            return _completions(payload, request, chat=self.api == "chat" or request.messages is not None)
        except (TypeError, ValueError, AttributeError) as e:  # e.g. usage {"prompt_tokens": "x"}
            return _failed(request, self.client.redact(f"malformed answer from {url}: {e}"))

    def _request_body(self, request: GenerationRequest, base_url: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": request.max_new_tokens,
                                "temperature": request.temperature, "n": request.n, **OPENAI_SAMPLING}
        if base_url in self._vllm:
            body.update(VLLM_SAMPLING)
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        if request.messages is not None:  # a conversation with tools, whatever `api` says of text prompts
            body["messages"] = request.messages
            if request.tools:
                body["tools"] = request.tools
            return f"{base_url}/chat/completions", body
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
            return f"{base_url}/chat/completions", body
        body["prompt"] = request.prompt
        return f"{base_url}/completions", body


def replica_urls(base_url: str | list[str]) -> list[str]:
    """`llm.base_url` as a list of replica URLs, each checked; a one-line error otherwise."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if not urls:
        raise PipelineError("llm.base_url is an empty list; give one URL or a list of replicas, "
                            "e.g. [http://node1:8000/v1, http://node2:8000/v1]")
    for url in urls:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise PipelineError(f"llm.base_url '{url}' is not an http(s) URL, e.g. "
                                "http://127.0.0.1:8000/v1")
    urls = [u.rstrip("/") for u in urls]
    repeated = sorted({u for u in urls if urls.count(u) > 1})
    if repeated:
        raise PipelineError(f"llm.base_url lists {repeated[0]} more than once; list each replica once")
    return urls


def _failed(request: GenerationRequest, reason: str) -> list[Completion]:
    return [Completion(text="", finish_reason="error", error=reason) for _ in range(request.n)]


def _check_choices(payload: Any) -> None:
    """A 200 without choices is a broken answer (a proxy, a half-started server): ask again."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise TransientPayload("answer has no 'choices' list of objects")


# A choice's finish_reason -> ours. vLLM's are "stop", "length", "abort", "error", "repetition"
# (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS; "error" reaches a client as an HTTP 500);
# "eos" and a missing one are older or other servers' "stop". "repetition" (vLLM stopped a looping
# output) is the model's own doing, cut short as at the token limit: "length", never an error the
# run would count against max_error_share and retry. Anything else ("abort", a hosted API's
# "content_filter", "tool_calls") means the text is not the model's own ending: an error.
_FINISH_REASONS = {None: "stop", "stop": "stop", "eos": "stop", "length": "length", "repetition": "length"}


def _completions(payload: dict, request: GenerationRequest, *, chat: bool) -> list[Completion]:
    """The `n` completions of one answer: a choice past `n` is dropped, a missing one (a server
    that returned fewer) becomes an error completion naming how many came."""
    choices = sorted(payload["choices"], key=lambda c: c.get("index", 0))[: request.n]
    texts = [_choice_text(c, chat) for c in choices]
    usage = payload.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    shares = _split_tokens(int(usage.get("completion_tokens") or 0), texts)
    out = []
    for choice, text, tokens in zip(choices, texts, shares, strict=True):
        text, stopped = cut_at_stop(text, request.stop)
        reason = choice.get("finish_reason")
        calls = (choice.get("message") or {}).get("tool_calls") if request.messages is not None else None
        if reason == "tool_calls" and request.messages is not None:  # the model's own ending of a tool turn
            reason = "stop"
        finish = "stop" if stopped else _FINISH_REASONS.get(reason, "error")
        error = f"finish_reason={reason}" if finish == "error" else None
        out.append(Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=tokens,
                              finish_reason=finish, error=error, tool_calls=calls if calls else None))
    out += [Completion(text="", finish_reason="error",
                       error=f"endpoint returned {len(choices)} of {request.n} choices")
            for _ in range(request.n - len(out))]
    return out


def _choice_text(choice: dict, chat: bool) -> str:
    if chat:
        return str((choice.get("message") or {}).get("content") or "")
    return str(choice.get("text") or "")


def _split_tokens(total: int, texts: list[str]) -> list[int]:
    """`usage` counts the n samples together; share it out by text length, summing exactly.
    Every completion carries the prompt's token count (the length it was conditioned on)."""
    if not texts:
        return []
    weights = [len(t) + 1 for t in texts]
    shares = [total * w // sum(weights) for w in weights]
    for i in range(total - sum(shares)):
        shares[i % len(shares)] += 1
    return shares
