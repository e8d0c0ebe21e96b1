"""The OpenAI-compatible HTTP backend against a fake endpoint on 127.0.0.1 (never the internet).

    .venv/bin/python -m pytest tests/test_llm_openai.py -q
"""

from __future__ import annotations

import json
import logging
import re
import socket

import pytest
from http_servers import FAULT_KINDS, FakeOpenAI, Fault

from pipeline.core.errors import PipelineError
from pipeline.llm.base import Completion, GenerationRequest
from pipeline.llm.config import LLMConfig
from pipeline.llm.openai_http import OpenAICompatibleLLM

KEY_ENV = "REACT_TEST_OPENAI_KEY"
PLANTED = "sk-PLANTED-7f3a9c1e5b2d4068"


def make_llm(server: FakeOpenAI, monkeypatch, *, key: str | None = None,
             **cfg) -> OpenAICompatibleLLM:
    if key is None:
        monkeypatch.delenv(KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(KEY_ENV, key)
    cfg.setdefault("timeout_s", 0.25)
    cfg.setdefault("max_retries", 3)
    config = LLMConfig(backend="openai", model=server.model, base_url=f"{server.url}/v1",
                       api_key_env=KEY_ENV, **cfg)
    return OpenAICompatibleLLM(config, backoff_base_s=0.01, backoff_max_s=0.05,
                               sleep=lambda s: None)


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


def test_completions_send_the_request_and_read_texts_and_usage(server, monkeypatch):
    server.replies["Q: one\nThought 1:"] = [" I should search.\nAction 1: Search[x]"]
    llm = make_llm(server, monkeypatch)
    out = llm.generate([
        GenerationRequest("Q: one\nThought 1:", stop=["\nObservation 1:"], max_new_tokens=50,
                          temperature=0.0, seed=7),
        GenerationRequest("Q: two", max_new_tokens=3),
    ])
    assert out == [
        [Completion(" I should search.\nAction 1: Search[x]", prompt_tokens=4,
                    completion_tokens=6, finish_reason="stop")],
        [Completion("sample 0: Q:", prompt_tokens=2, completion_tokens=3,
                    finish_reason="length")],
    ]
    bodies = sorted((r.body for r in server.requests), key=lambda b: b["prompt"])
    assert bodies[0] == {"model": "fake-model", "prompt": "Q: one\nThought 1:", "max_tokens": 50,
                         "temperature": 0.0, "n": 1, "stop": ["\nObservation 1:"], "seed": 7,
                         "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert "stop" not in bodies[1] and "seed" not in bodies[1]
    assert {r.path for r in server.requests} == {"/v1/completions"}
    assert "Authorization" not in server.requests[0].headers  # no key set: none sent
    assert llm.name == "fake-model"


def test_chat_mode_sends_one_user_message(server, monkeypatch):
    llm = make_llm(server, monkeypatch, api="chat", name="teacher-x")
    [[c]] = llm.generate([GenerationRequest("What is 2+2?", max_new_tokens=20)])
    assert c.text == "sample 0: What is 2+2?" and c.finish_reason == "stop"
    assert c.prompt_tokens == 3 and c.completion_tokens == 5
    request = server.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.body["messages"] == [{"role": "user", "content": "What is 2+2?"}]
    assert llm.name == "teacher-x"


def test_n_samples_come_back_in_index_order_with_usage_shared_out(server, monkeypatch):
    server.replies["p"] = ["a b c", "d", "e f"]
    [samples] = make_llm(server, monkeypatch).generate(
        [GenerationRequest("p", n=3, temperature=0.7, max_new_tokens=10)])
    assert [c.text for c in samples] == ["a b c", "d", "e f"]  # the server sent them reversed
    assert sum(c.completion_tokens for c in samples) == 6  # the usage total, split exactly
    assert all(c.prompt_tokens == 1 for c in samples)
    assert server.requests[0].body["n"] == 3 and len(server.requests) == 1


def test_stop_is_applied_even_when_the_server_ignores_it(monkeypatch):
    with FakeOpenAI(honour_stop=False) as server:
        server.replies["p"] = ["think\nAction 1: Search[a]\nObservation 1: made up"]
        [[c]] = make_llm(server, monkeypatch).generate(
            [GenerationRequest("p", stop=["\nObservation 1:"], max_new_tokens=100)])
    assert c.text == "think\nAction 1: Search[a]" and c.finish_reason == "stop"


def test_missing_usage_gives_zero_counts_and_short_answers_are_flagged(server, monkeypatch):
    server.usage = False
    llm = make_llm(server, monkeypatch)
    [[c]] = llm.generate([GenerationRequest("p")])
    assert (c.prompt_tokens, c.completion_tokens) == (0, 0) and c.error is None


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_is_retried_and_the_batch_completes(server, monkeypatch, kind):
    server.fail_prompt("flaky", Fault(kind, retry_after="0"), Fault(kind, retry_after="0"))
    llm = make_llm(server, monkeypatch, max_concurrency=4)
    prompts = ["a", "flaky one", "c", "d"]
    out = llm.generate([GenerationRequest(p, max_new_tokens=20) for p in prompts])
    assert [o[0].text for o in out] == [f"sample 0: {p}" for p in prompts]
    assert all(o[0].error is None for o in out)
    assert server.outcomes == {kind: 2, "ok": 4}


def test_a_request_that_keeps_failing_becomes_error_completions_and_the_rest_go_on(
        server, monkeypatch):
    server.fail_prompt("doomed", *[Fault("503")] * 10)
    llm = make_llm(server, monkeypatch, max_retries=2)
    out = llm.generate([GenerationRequest("ok 1"), GenerationRequest("doomed", n=2),
                        GenerationRequest("ok 2")])
    assert [c.text for c in out[0] + out[2]] == ["sample 0: ok 1", "sample 0: ok 2"]
    assert len(out[1]) == 2
    for c in out[1]:
        assert c.finish_reason == "error" and c.text == ""
        assert c.error.endswith("gave up after 3 attempts; last: HTTP 503: "
                                '{"error": {"message": "server error"}}')
    assert server.outcomes["503"] == 3  # bounded: max_retries + 1 attempts


def test_malformed_answers_are_retried_or_reported_never_raised(server, monkeypatch):
    server.fail_prompt("empty", "api:no_choices")  # retried, then fine
    server.fail_prompt("weird", "api:bad_usage")  # a 200 that cannot be read: reported
    out = make_llm(server, monkeypatch).generate(
        [GenerationRequest("empty"), GenerationRequest("weird", n=2)])
    assert out[0][0].text == "sample 0: empty"
    assert [c.finish_reason for c in out[1]] == ["error", "error"]
    assert out[1][0].error.startswith("malformed answer from http://127.0.0.1:")
    assert server.outcomes == {"api:no_choices": 1, "api:bad_usage": 1, "ok": 1}


def test_context_overflow_fails_that_request_once_without_retries(server, monkeypatch):
    out = make_llm(server, monkeypatch).generate(
        [GenerationRequest("CONTEXT_OVERFLOW " * 3), GenerationRequest("fine")])
    assert out[0][0].finish_reason == "error" and "maximum context length" in out[0][0].error
    assert "HTTP 400" in out[0][0].error
    assert out[1][0].text == "sample 0: fine"
    assert len(server.requests) == 2


@pytest.mark.parametrize("limit", [1, 3])
def test_concurrency_is_bounded_by_max_concurrency(monkeypatch, limit):
    with FakeOpenAI(latency_s=0.06) as server:
        llm = make_llm(server, monkeypatch, max_concurrency=limit, timeout_s=2.0)
        out = llm.generate([GenerationRequest(f"q{i}") for i in range(3 * limit + 3)])
        llm.generate([GenerationRequest("again")])  # the pool is reused across calls
        llm.close()
    assert [o[0].text for o in out] == [f"sample 0: q{i}" for i in range(3 * limit + 3)]
    assert server.max_in_flight == limit  # reached, never exceeded


def test_check_available_accepts_a_served_model(server, monkeypatch):
    make_llm(server, monkeypatch).check_available()
    assert server.requests[0].path == "/v1/models"


def test_check_available_names_a_model_that_is_not_served(server, monkeypatch):
    llm = make_llm(server, monkeypatch)
    llm.model = "other-model"
    with pytest.raises(PipelineError, match=r"model 'other-model' is not served by .* "
                       r"\(it serves \['fake-model'\]\); fix llm.model$"):
        llm.check_available()


def test_check_available_reports_an_unreachable_endpoint_in_one_line(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = LLMConfig(backend="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1",
                       api_key_env=KEY_ENV, ready_timeout_s=0)  # 0: no wait for it to come up
    llm = OpenAICompatibleLLM(config, backoff_base_s=0.01, sleep=lambda s: None)
    with pytest.raises(PipelineError) as info:
        llm.check_available()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("OpenAI-compatible endpoint unavailable: GET http://127.0.0.1:")
    assert "connection failed" in message and "fix llm.base_url" in message
    # generation against it fails per request, not with an exception
    [[c]] = llm.generate([GenerationRequest("p")])
    assert c.finish_reason == "error" and "connection failed" in c.error


def test_a_planted_key_is_sent_but_never_appears_in_errors_reprs_or_logs(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    with FakeOpenAI(api_key="sk-the-right-one") as server:
        llm = make_llm(server, monkeypatch, key=PLANTED, max_retries=1)
        server.fail_prompt("p", Fault("503"))  # one retry gets logged too
        [[c]] = llm.generate([GenerationRequest("p")])  # 401 echoing the planted key
        with pytest.raises(PipelineError) as info:
            llm.check_available()
    assert server.requests[0].headers["Authorization"] == f"Bearer {PLANTED}"
    assert c.finish_reason == "error" and "HTTP 401" in c.error and "***" in c.error
    assert "key from $REACT_TEST_OPENAI_KEY was refused" in str(info.value)
    assert "retry 1/1" in caplog.text
    for text in (c.error, str(c), str(info.value), repr(info.value), repr(llm),
                 repr(llm.client), caplog.text, repr(vars(llm))):
        assert PLANTED not in text


def test_a_right_key_is_accepted(monkeypatch):
    with FakeOpenAI(api_key=PLANTED) as server:
        llm = make_llm(server, monkeypatch, key=PLANTED)
        llm.check_available()
        [[c]] = llm.generate([GenerationRequest("p")])
    assert c.text == "sample 0: p"


@pytest.mark.parametrize("field,value,message", [
    ("api", "edit", "llm.api 'edit' is unknown"),  # the key was `mode`
    ("base_url", "127.0.0.1:8000/v1", "is not an http(s) URL"),
    ("max_concurrency", 0, "llm.max_concurrency must be >= 1"),
])
def test_bad_config_is_a_one_line_error(field, value, message):
    with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OpenAICompatibleLLM(LLMConfig(backend="openai", **{field: value}))


# ------------------------------------------------------------------ replicas (several base URLs)

def make_replicated(servers: list, urls: list[str] | None = None, **cfg) -> OpenAICompatibleLLM:
    """The backend over several real servers on 127.0.0.1 (FakeOpenAI: a stand-in for
    `vllm serve`), one per replica."""
    cfg.setdefault("timeout_s", 2.0)
    cfg.setdefault("max_retries", 1)
    config = LLMConfig(backend="openai", model="fake-model", api_key_env=KEY_ENV,
                       base_url=urls or [f"{s.url}/v1" for s in servers], **cfg)
    return OpenAICompatibleLLM(config, backoff_base_s=0.01, backoff_max_s=0.05, sleep=lambda s: None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_replicas_share_the_requests_and_each_stays_within_max_concurrency(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with FakeOpenAI(latency_s=0.05) as a, FakeOpenAI(latency_s=0.05) as b:
        llm = make_replicated([a, b], max_concurrency=2)
        llm.check_available()
        out = llm.generate([GenerationRequest(f"q{i}") for i in range(12)])
        llm.close()
    assert [o[0].text for o in out] == [f"sample 0: q{i}" for i in range(12)]
    posts = [len([r for r in s.requests if r.method == "POST"]) for s in (a, b)]
    assert sum(posts) == 12 and min(posts) >= 4  # both busy (least-outstanding keeps them even)
    assert a.max_in_flight == b.max_in_flight == 2  # each filled to its bound, never past it


def test_a_dead_replica_is_named_by_the_check_and_its_requests_fail_over(monkeypatch, caplog):
    monkeypatch.delenv(KEY_ENV, raising=False)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with FakeOpenAI() as live:
        llm = make_replicated([], urls=[f"{live.url}/v1", dead], max_concurrency=1, ready_timeout_s=0)
        with pytest.raises(PipelineError) as info:
            llm.check_available()
        out = llm.generate([GenerationRequest(f"q{i}") for i in range(4)])
        llm.close()
    message = str(info.value)
    assert message.startswith(f"OpenAI-compatible endpoint unavailable: replica 2 of 2 ({dead}): GET {dead}/models")
    assert "connection failed" in message and "\n" not in message
    assert [o[0].text for o in out] == [f"sample 0: q{i}" for i in range(4)]  # all answered by the live one
    assert f"replica 2 of 2 ({dead}) failed (POST {dead}/completions: gave up after 2 attempts" in caplog.text
    assert caplog.text.count("its requests go to the other replicas") == 1  # set aside once, not per request


def test_when_every_replica_fails_the_error_names_each(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with FakeOpenAI() as a, FakeOpenAI() as b:
        a.fail_prompt("doomed", *[Fault("503")] * 4)
        b.fail_prompt("doomed", *[Fault("503")] * 4)
        llm = make_replicated([a, b])
        [[c]] = llm.generate([GenerationRequest("doomed")])
        [[after]] = llm.generate([GenerationRequest("fine")])  # both set aside: still tried
    assert c.finish_reason == "error"
    assert c.error.count("gave up after 2 attempts; last: HTTP 503") == 2
    assert f"replica 1 of 2 ({a.url}/v1): POST {a.url}/v1/completions" in c.error
    assert f"replica 2 of 2 ({b.url}/v1): POST {b.url}/v1/completions" in c.error
    assert after.text == "sample 0: fine"


def test_a_request_error_is_not_blamed_on_the_replica(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with FakeOpenAI() as a, FakeOpenAI() as b:
        llm = make_replicated([a, b], max_concurrency=1)
        [[c]] = llm.generate([GenerationRequest("CONTEXT_OVERFLOW")])  # HTTP 400: the request's fault
    assert c.finish_reason == "error" and "maximum context length" in c.error
    assert len(a.requests) + len(b.requests) == 1  # no failover, no retry elsewhere
    assert all(r.down_until == 0.0 for r in llm.replicas.replicas)


@pytest.mark.parametrize("urls,message", [
    ([], "llm.base_url is an empty list"),
    (["http://a:8000/v1", "b:8000/v1"], "llm.base_url 'b:8000/v1' is not an http(s) URL"),
    (["http://a:8000/v1", "http://a:8000/v1/"], "lists http://a:8000/v1 more than once"),
])
def test_bad_replica_lists_are_one_line_errors(urls, message):
    with pytest.raises(PipelineError, match=re.escape(message)):
        OpenAICompatibleLLM(LLMConfig(backend="openai", base_url=urls))


def test_a_list_of_base_urls_reads_from_yaml_and_the_command_line(tmp_path):
    from pipeline.core.config import load_config

    cfg = load_config(LLMConfig, overrides=["base_url=[http://a:8000/v1, http://b:8000/v1]"])
    assert cfg.base_url == ["http://a:8000/v1", "http://b:8000/v1"]
    assert load_config(LLMConfig, overrides=["base_url=http://a:8000/v1"]).base_url == "http://a:8000/v1"


def test_the_set_aside_lasts_60_s_and_a_recovered_replica_takes_requests_again(monkeypatch, caplog):
    """ReplicaSet's clock, moved by hand: a replica whose request failed for good is passed over
    for DOWN_S (60 s) of that clock, and from then on it is used again (the least recently used)."""
    from pipeline.llm.replicas import DOWN_S, ReplicaSet

    monkeypatch.delenv(KEY_ENV, raising=False)
    now = [1000.0]
    with FakeOpenAI() as a, FakeOpenAI() as b:
        llm = make_replicated([a, b], max_concurrency=1)
        llm.replicas = ReplicaSet([f"{a.url}/v1", f"{b.url}/v1"], 1, clock=lambda: now[0])

        def answered_by(prompt: str) -> str:
            before = len(a.requests), len(b.requests)
            [[c]] = llm.generate([GenerationRequest(prompt)])
            assert c.text == f"sample 0: {prompt}" and c.error is None
            return "a" if len(a.requests) > before[0] else "b"

        assert answered_by("first") == "a"
        b.inject(Fault("503"), Fault("503"))  # the next request goes to b (least recently used) and
        assert answered_by("b fails") == "a"  # fails there for good (2 attempts): sent once more, to a
        assert b.outcomes["503"] == 2
        for t in (0.0, 30.0, DOWN_S - 0.01):  # set aside: a takes every request meanwhile
            now[0] = 1000.0 + t
            assert answered_by(f"at {t}") == "a"
        now[0] = 1000.0 + DOWN_S  # back: b, unused the longest, takes the next request
        assert [answered_by("back 1"), answered_by("back 2"), answered_by("back 3")] == ["b", "a", "b"]
        llm.close()
    assert caplog.text.count("its requests go to the other replicas for 60 s") == 1


def test_a_replica_that_dies_mid_run_is_set_aside_and_every_request_is_answered(tmp_path, monkeypatch, caplog):
    """Replica 2 is a real process (tests/standin_vllm_serve.py, a stand-in for `vllm serve`) that
    answers 3 requests, then exits at the 4th without answering it, while requests are in flight."""
    import subprocess
    import sys
    from pathlib import Path

    from http_servers import wait_until

    monkeypatch.delenv(KEY_ENV, raising=False)
    port = free_port()
    record = tmp_path / "standin.jsonl"
    standin = subprocess.Popen([sys.executable, str(Path(__file__).parent / "standin_vllm_serve.py"), "fake-model",
                                "--port", str(port), "--standin-die-after", "3", "--standin-record", str(record)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with FakeOpenAI(latency_s=0.02) as live:
            llm = make_replicated([], urls=[f"{live.url}/v1", f"http://127.0.0.1:{port}/v1"], max_concurrency=2)
            assert wait_until(lambda: _answers(llm), timeout_s=30), "the stand-in server did not start"
            out = llm.generate([GenerationRequest(f"q{i}") for i in range(16)])
            llm.close()
        assert standin.wait(timeout=10) == 3  # it died (os._exit(3)), not stopped by us
    finally:
        if standin.poll() is None:
            standin.kill()
            standin.wait()
    assert [o[0].text for o in out] == [f"sample 0: q{i}" for i in range(16)]
    assert all(o[0].error is None for o in out)
    entries = [json.loads(line) for line in record.read_text().splitlines()]
    assert len([e for e in entries if "model" in e]) == 3  # it took 3 requests, and died at the 4th
    # Mid-run: some answers came from it; the rest (the one it died on, any whose answer its death
    # cut off, and all after it was set aside) from the live replica, each request answered once.
    assert 16 - 3 <= len([r for r in live.requests if r.method == "POST"]) < 16
    assert caplog.text.count(f"replica 2 of 2 (http://127.0.0.1:{port}/v1) failed") == 1


def _answers(llm: OpenAICompatibleLLM) -> bool:
    try:
        llm.check_available()
        return True
    except PipelineError:
        return False


# ------------------------------------------------------------------ answers that are not n whole choices

def test_a_server_returning_fewer_choices_than_n_gives_an_error_completion_for_each_missing_one(
        server, monkeypatch):
    server.max_choices = 2
    llm = make_llm(server, monkeypatch)
    [samples] = llm.generate([GenerationRequest("p", n=3, temperature=0.7)])
    assert [(c.text, c.finish_reason, c.error) for c in samples] == [
        ("sample 0: p", "stop", None), ("sample 1: p", "stop", None),
        ("", "error", "endpoint returned 2 of 3 choices")]
    server.max_choices = 0  # a 200 with an empty choices list
    [[c]] = llm.generate([GenerationRequest("q")])
    assert (c.finish_reason, c.error) == ("error", "endpoint returned 0 of 1 choices")
    assert server.outcomes == {"ok": 2}  # one call each: a whole answer, not retried


@pytest.mark.parametrize("reason,finish,end_reason", [
    ("content_filter", "error", "llm_error: finish_reason=content_filter"),  # a hosted API's filter
    ("abort", "error", "llm_error: finish_reason=abort"),  # vLLM: the request was aborted
    ("tool_calls", "error", "llm_error: finish_reason=tool_calls"),
    ("repetition", "length", "runaway"),  # vLLM stopped a looping output: the model's own doing
    ("eos", "stop", "finish"),
])
def test_a_finish_reason_other_than_stop_or_length(server, monkeypatch, reason, finish, end_reason):
    """Through the backend and then a Standard episode (the agent runner, as eval runs it)."""
    from pipeline.agent.scheduler import run_episodes
    from pipeline.methods import MethodSettings, build_method
    from pipeline.tasks.hotpotqa.questions import Question

    server.finish_reason = reason
    llm = make_llm(server, monkeypatch)
    [[c]] = llm.generate([GenerationRequest("p", max_new_tokens=50)])
    assert (c.text, c.finish_reason) == ("sample 0: p", finish)
    assert c.error == (f"finish_reason={reason}" if finish == "error" else None)
    question = Question(id="q1", question="Who?", answer="Nobody")
    [record] = run_episodes(llm, lambda: None, [question], build_method("standard", MethodSettings()))
    llm.close()
    assert record["end_reason"] == end_reason


@pytest.mark.parametrize("owned_by, sent", [
    ("vllm", {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
              "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}),
    (None, {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0})])
def test_every_sampling_knob_is_sent_so_no_server_fills_one_in_from_the_models_generation_config(
        monkeypatch, owned_by, sent):
    """A vLLM server fills each knob a request leaves out from the model's generation_config.json
    (Llama-3.1's top_p 0.9): sampled requests (CoT-SC, samples > 1, rejection sampling) would use
    nucleus sampling there and not on the in-process backends. A server whose /v1/models says it
    is vLLM is sent vLLM's knobs too; another (a hosted API refuses unknown fields) the OpenAI ones."""
    with FakeOpenAI(owned_by=owned_by) as server:
        llm = make_llm(server, monkeypatch)
        llm.check_available()
        llm.generate([GenerationRequest("Q: sampled", temperature=0.7, n=3, seed=1)])
        body = server.requests[-1].body
    assert {k: body[k] for k in body if k not in ("model", "prompt", "max_tokens", "temperature", "n", "seed")} == sent
    assert llm.sampling_fields() == sent  # what the manifests record
