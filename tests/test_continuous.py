"""Continuous scheduling against a server: each episode sends its next request as soon as its
last one is back, with the same records as the round-based runner.

The server is a STAND-IN for a continuous-batching server (vLLM, llama-server): `PacedOpenAI`, the
fake OpenAI-compatible endpoint of tests/http_servers.py on 127.0.0.1, answering each request on
its own thread after a latency chosen per question (slow for one question, fast for the others),
and logging when each request arrived and when its answer left.

    .venv/bin/python -m pytest tests/test_continuous.py -q
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import pytest
from http_servers import FakeOpenAI, Fault
from test_agent import (
    QUESTIONS,
    DictBackend,
    current_question,
    paper_prompts,
    responder,
    settings_for,
)

from pipeline.agent.answerers import PromptedModel
from pipeline.agent.episodes import run_methods
from pipeline.agent.scheduler import run_episodes, schedule_for
from pipeline.core.errors import PipelineError
from pipeline.llm.config import LLMConfig
from pipeline.llm.openai_http import OpenAICompatibleLLM
from pipeline.llm.scripted import ScriptedLLM
from pipeline.methods import build_method

__all__ = ["paper_prompts"]  # the fixture, shared with test_agent

SLOW_QUESTION = "Which magazine was started first, Arthur's Magazine or First for Women?"
SLOW_S, FAST_S = 0.4, 0.01


@dataclass
class Logged:
    question: str
    arrived: float
    answered: float


class Replies(dict):
    """FakeOpenAI.replies computed from the prompt by test_agent's scripted agent (it reads the
    observations in its prompt, so a runner that mixed up episodes would change the records)."""

    def get(self, prompt, default=None):
        return [responder(prompt, None)]


class PacedOpenAI(FakeOpenAI):
    """Stand-in continuous-batching server: every request is answered on its own thread after
    `delay(question)` seconds, however many others are in flight; `log` says when each came and went."""

    def __init__(self, delay=lambda question: SLOW_S if question == SLOW_QUESTION else FAST_S):
        super().__init__(model="paced")
        self.replies = Replies()
        self.delay = delay
        self.log: list[Logged] = []

    def answer(self, request):
        if request.path != "/v1/completions":
            return super().answer(request)
        question = current_question(request.body["prompt"])
        arrived = time.monotonic()
        self.sleep(self.delay(question))
        reply = super().answer(request)
        with self._lock:
            self.log.append(Logged(question, arrived, time.monotonic()))
        return reply


def http_llm(server: FakeOpenAI, **cfg) -> OpenAICompatibleLLM:
    cfg = {"max_concurrency": 16, "timeout_s": 5.0, "max_retries": 1, **cfg}
    config = LLMConfig(backend="openai", model=server.model, base_url=f"{server.url}/v1",
                       api_key_env="", **cfg)
    return OpenAICompatibleLLM(config, backoff_base_s=0.01, backoff_max_s=0.02, sleep=lambda s: None)


def without_seconds(records: list[dict]) -> dict[str, dict]:
    return {r["id"]: {k: v for k, v in r.items() if k != "seconds"} for r in records}


def run(schedule: str, method_name: str, paper_prompts, *, max_in_flight: int = 8, server=None, **cfg):
    method = build_method(method_name, settings_for(paper_prompts))
    with (server or PacedOpenAI()) as srv:
        llm = http_llm(srv, **cfg)
        records = run_episodes(llm, DictBackend, QUESTIONS, method, max_in_flight=max_in_flight,
                               schedule=schedule)
        llm.close()
    for r in records:  # each run has its own server and port: name it the same in error reasons
        r["end_reason"] = r["end_reason"].replace(srv.url, "<server>")
    return records, srv


def test_the_rule_server_backends_run_continuously_in_process_ones_in_rounds():
    with FakeOpenAI() as server:
        assert schedule_for(http_llm(server)) == "continuous"
    assert schedule_for(ScriptedLLM(responder)) == "rounds"
    assert schedule_for(None) == "rounds"
    with pytest.raises(PipelineError, match="schedule must be one of"):
        run_episodes(None, DictBackend, [], None, schedule="eager")


@pytest.mark.parametrize("method_name", ["react", "act", "cot_sc_to_react"])
def test_records_are_those_of_the_round_based_runner(method_name, paper_prompts):
    rounds, _ = run("rounds", method_name, paper_prompts)
    continuous, _ = run("continuous", method_name, paper_prompts)
    assert without_seconds(continuous) == without_seconds(rounds)
    assert len(continuous) == len(QUESTIONS)
    by_id = without_seconds(continuous)
    if method_name != "cot_sc_to_react":  # that one answers q-nixon from its CoT-SC votes
        assert by_id["q-nixon"]["em"] == 1.0 and by_id["q-nixon"]["n_steps"] == 3, by_id["q-nixon"]
    # records finish in their own time: the slow question is not held back by a round, or vice versa
    assert continuous[-1]["id"] == "q-mag" or method_name != "react"


def overtakes(log: list[Logged]) -> list[tuple[str, Logged]]:
    """Fast episodes' requests sent after another request of the same episode had returned,
    while a slow request that was sent before that earlier one is still out."""
    found = []
    slow = [e for e in log if e.question == SLOW_QUESTION]
    fast = sorted((e for e in log if e.question != SLOW_QUESTION), key=lambda e: e.arrived)
    for s in slow:
        for earlier in fast:
            later = [e for e in fast if e.question == earlier.question and e.arrived >= earlier.answered]
            if earlier.arrived >= s.arrived and later and later[0].arrived < s.answered:
                found.append((earlier.question, later[0]))
    return found


def test_a_fast_episode_sends_its_next_request_before_a_slow_one_returns(paper_prompts):
    records, server = run("continuous", "react", paper_prompts)
    assert overtakes(server.log), [(e.question[:20], round(e.arrived, 3), round(e.answered, 3))
                                   for e in server.log]
    # the check can fail: in rounds, no request goes out while a slow one is still out
    _, server = run("rounds", "react", paper_prompts)
    assert not overtakes(server.log)


@pytest.mark.parametrize("max_in_flight", [1, 2, 3])
def test_max_in_flight_is_never_exceeded(paper_prompts, max_in_flight):
    # every request held 0.1 s, so that the episodes' requests overlap at the server
    records, server = run("continuous", "react", paper_prompts, max_in_flight=max_in_flight,
                          server=PacedOpenAI(delay=lambda question: 0.1))
    assert len(records) == len(QUESTIONS)
    assert server.max_in_flight == max_in_flight  # reached, never exceeded (the backend allows 16)


def test_one_episode_whose_requests_keep_failing_ends_alone_as_today(paper_prompts):
    """The server fails every request of one question (after the backend's retry): that episode
    ends with `llm_error: <reason>`, the others finish, in both schedules alike."""
    def failing_server():
        server = PacedOpenAI()
        server.fail_prompt("Question: Who created Milhouse?", *[Fault("500")] * 4)
        return server

    rounds, _ = run("rounds", "react", paper_prompts, server=failing_server())
    continuous, _ = run("continuous", "react", paper_prompts, server=failing_server())
    assert without_seconds(continuous) == without_seconds(rounds)
    failed = without_seconds(continuous)["q-short"]
    assert failed["end_reason"].startswith("llm_error: ") and "HTTP 500" in failed["end_reason"], failed
    assert without_seconds(continuous)["q-nixon"]["end_reason"] == "finish"


class DyingServer(PacedOpenAI):
    """Stand-in server that dies after `answered` requests: every later connection is closed unanswered."""

    def __init__(self, answered: int):
        super().__init__()
        self.answered = answered

    def next_fault(self, request):
        with self._lock:
            dead = len(self.requests) >= self.answered
        return Fault("reset") if dead else super().next_fault(request)


def test_a_server_that_dies_mid_run_ends_the_rest_with_the_same_error(paper_prompts):
    """After its 6th request the server closes every connection unanswered: no hang, no
    exception, every question gets a record, and each cut episode says why, as in rounds."""
    reasons = {}
    for schedule in ("rounds", "continuous"):
        records, server = run(schedule, "react", paper_prompts, server=DyingServer(answered=6))
        assert sorted(r["id"] for r in records) == sorted(q.id for q in QUESTIONS)
        reasons[schedule] = {r["end_reason"] for r in records if r["end_reason"] != "finish"}
        assert reasons[schedule] and all(r.startswith("llm_error: ") for r in reasons[schedule]), records
    assert reasons["continuous"] == reasons["rounds"]


def test_a_run_stopped_by_an_error_raises_it_and_resumes_to_the_uninterrupted_records(
        paper_prompts, tmp_path, monkeypatch):
    """A record that cannot be written (a full disk) stops a continuous run with that error, as it
    stops a round-based one; nothing goes on sending in the background; a re-run writes the rest."""
    import pipeline.agent.episodes as episodes

    settings = replace(settings_for(paper_prompts))
    model = PromptedModel(LLMConfig(backend="openai", model="paced"))

    class FullDisk(episodes.JsonlAppender):
        written = 0

        def append(self, record):
            if FullDisk.written == 2:
                raise OSError(28, "No space left on device")
            FullDisk.written += 1
            super().append(record)

    with PacedOpenAI() as server:
        llm = http_llm(server)
        monkeypatch.setattr(episodes, "JsonlAppender", FullDisk)
        with pytest.raises(OSError, match="No space left on device"):
            run_methods(model, llm, ["react"], QUESTIONS, settings, DictBackend(), tmp_path / "run",
                        max_in_flight=3, source="generate")
        time.sleep(SLOW_S + 0.2)  # calls already out (or on their way) come back, unused ...
        sent = len(server.requests)
        time.sleep(3 * SLOW_S)
        assert len(server.requests) == sent  # ... and no episode goes on sending
        monkeypatch.setattr(episodes, "JsonlAppender", FullDisk.__mro__[1])
        first = episodes.read_jsonl(tmp_path / "run" / "react.jsonl")
        assert len(first) == 2
        run_methods(model, llm, ["react"], QUESTIONS, settings, DictBackend(), tmp_path / "run",
                    max_in_flight=3, source="generate")
        resumed = episodes.read_jsonl(tmp_path / "run" / "react.jsonl")
        whole = run_episodes(llm, DictBackend, QUESTIONS, build_method("react", settings), teacher="paced",
                             max_in_flight=3)
        llm.close()
    assert resumed[:2] == first
    assert without_seconds(resumed) == without_seconds(whole)
