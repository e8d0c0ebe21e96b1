"""`prompting.interface: tools`: Act and ReAct acting through native tool calls of an
OpenAI-compatible chat endpoint (pipeline/methods/tool_calling.py), over the real local index.

The chat server here is a STAND-IN: a real HTTP server on 127.0.0.1 that answers each request
from a script keyed by the question (no model), so that each error path (no tool call, an
unknown tool, arguments that are not JSON, two calls in one turn) is met on purpose.

    .venv/bin/python -m pytest tests/test_tool_calling.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from episode_testdata import CORPUS, EPISODE_FIELDS, read_records, write_questions
from http_servers import FaultyServer, Recorded, Reply

from pipeline.core.config import build
from pipeline.core.errors import PipelineError
from pipeline.core.messages import to_messages, tool_schemas, wire_messages
from pipeline.core.storage import read_jsonl
from pipeline.core.trajectory import Trajectory, render

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")
MODEL = "stand-in-chat"


def call(name: str, arguments) -> dict:
    return {"id": f"call-{name}", "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}


class StandInToolChat(FaultyServer):
    """/v1/models and /v1/chat/completions answered from `script[question][k]`: the k-th
    assistant turn of that question's conversation, as (content, tool calls)."""

    def __init__(self, script: dict[str, list[tuple[str, list[dict]]]]):
        super().__init__()
        self.script = script

    def answer(self, request: Recorded) -> Reply:
        if request.method == "GET" and request.path == "/v1/models":
            return Reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        messages = request.body["messages"]
        question = messages[0]["content"].removeprefix("Question: ")  # the question line, one line
        content, calls = self.script[question][sum(m["role"] == "assistant" for m in messages)]
        message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        return Reply(200, {"choices": [{"index": 0, "message": message,
                                        "finish_reason": "tool_calls" if calls else "stop"}],
                           "usage": {"prompt_tokens": 50, "completion_tokens": 10}})


@pytest.fixture(scope="module")
def questions():
    from pipeline.tasks.hotpotqa.questions import load_question_set

    return load_question_set("offline-eval", limit=5)


def scripts(questions) -> dict:
    """The stand-in's replies by question line (one line, as the user turn holds it): the first
    question searched and answered, each other one a different bad reply."""
    ok, *bad = questions
    keys = [" ".join(q.question.split()) for q in questions]
    replies = [
        [("I need to search it.", [call("search", {"entity": ok.gold_titles[0]})]),
         ("So that is the answer.", [call("finish", {"answer": ok.answer})])],
        [("I think the answer is Paris.", [])],
        [("Let me browse.", [call("browse", {"url": "https://example.org"})])],
        [("Search it.", [call("search", '{"entity": "Paris"')])],
        [("Both.", [call("search", {"entity": "A"}), call("search", {"entity": "B"})])],
    ]
    return dict(zip(keys, replies, strict=True))


def generate_with(server: StandInToolChat, index: Path, qfile: Path, out: Path, method: str = "react") -> dict:
    from pipeline.stages.generate import GenerateConfig, generate

    return generate(build(GenerateConfig, {
        "teacher": {"backend": "openai", "model": MODEL, "base_url": f"{server.url}/v1"},
        "prompting": {"interface": "tools"}, "methods": [method], "questions": str(qfile),
        "out_dir": str(out), "wiki": {"index": str(index)}}))


def test_react_acts_through_tool_calls_and_each_bad_reply_ends_its_episode_with_a_reason(tmp_path, index, questions):
    qfile = write_questions(tmp_path / "q.jsonl", questions)
    with StandInToolChat(scripts(questions)) as server:
        generate_with(server, index, qfile, tmp_path / "gen")
        requests = [r for r in server.requests if r.method == "POST"]
    records = {r["id"]: r for r in read_records(tmp_path / "gen" / "react.jsonl")}
    ok = questions[0]
    assert [records[q.id]["end_reason"] for q in questions] == \
        ["finish", "no_tool_call", "unknown_tool", "bad_arguments", "several_tool_calls"]
    record = records[ok.id]
    assert set(record) == EPISODE_FIELDS and record["em"] == 1.0 and record["prediction"] == ok.answer
    assert [s["action"] for s in record["steps"]] == [f"Search[{ok.gold_titles[0]}]", f"Finish[{ok.answer}]"]
    observation = record["steps"][0]["observation"]
    assert observation and not observation.startswith("Could not find")  # the real index's page
    traj = Trajectory.from_dict(record["trajectory"])
    assert record["text"] == render(traj).text and traj.steps[0].thought == "I need to search it."
    # Every request carried the tools and the conversation so far, as messages.jsonl writes it.
    assert all(r.path == "/v1/chat/completions" and r.body["tools"] == tool_schemas() for r in requests)
    second = next(r.body["messages"] for r in requests if len(r.body["messages"]) == 3)
    assert second == wire_messages(to_messages(traj)[:3])
    assert json.loads(second[1]["tool_calls"][0]["function"]["arguments"]) == {"entity": ok.gold_titles[0]}
    assert second[2] == {"role": "tool", "tool_call_id": "call_1", "name": "search", "content": observation}
    # What the model wrote stays as the last step's thought; no action was taken.
    refused = records[questions[1].id]
    assert refused["steps"] == [{"thought": "I think the answer is Paris.", "action": "", "observation": None}]
    assert refused["prediction"] is None and refused["em"] == 0.0
    # filter reads these records as any others: the one correct episode, in both layouts
    from pipeline.stages.filter import FilterConfig, run_filter

    run_filter(FilterConfig(inputs=[str(tmp_path / "gen")], out_dir=str(tmp_path / "sft")))
    [row] = read_jsonl(tmp_path / "sft" / "react" / "messages.jsonl")
    assert wire_messages(row["messages"][:3]) == second


def test_act_keeps_no_thought(tmp_path, index, questions):
    ok = questions[0]
    qfile = write_questions(tmp_path / "q.jsonl", [ok])
    with StandInToolChat(scripts(questions)) as server:
        generate_with(server, index, qfile, tmp_path / "gen", "act")
    [record] = read_records(tmp_path / "gen" / "act.jsonl")
    assert record["end_reason"] == "finish" and [s["thought"] for s in record["steps"]] == [None, None]
    assert record["text"].startswith(f"Question: {ok.question}\nAction 1: Search[")


@pytest.mark.parametrize(("settings", "backend", "message"), [
    ({"interface": "tools"}, "transformers", "the 'transformers' backend has none: set backend: openai"),
    ({"interface": "tool"}, "openai", "unknown prompting.interface 'tool'; expected one of text, tools"),
    ({"interface": "tools", "loop": "original"}, "openai", "not the text that style=fireact or loop=original"),
])
def test_settings_the_tool_interface_cannot_run_are_refused_before_anything_runs(tmp_path, settings, backend, message):
    from pipeline.agent.answerers import PromptedModel
    from pipeline.llm.config import LLMConfig
    from pipeline.methods import MethodSettings

    with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PromptedModel(LLMConfig(backend=backend, model=MODEL)).check(["react"], MethodSettings(**settings))
    with pytest.raises(PipelineError, match="runs act and react through tool calls, not 'cot'"):
        PromptedModel(LLMConfig(backend="openai", model=MODEL)).check(["cot"], MethodSettings(interface="tools"))


def test_a_run_written_before_the_interface_key_is_the_same_run():
    """A manifest's `prompting` without `interface` (written before it existed) ran the text interface."""
    from pipeline.agent.run_folder import identity
    from pipeline.core.config import to_dict, upgrade_keys
    from pipeline.stages.generate import GenerateConfig

    today = to_dict(build(GenerateConfig, {}))
    older = {**today, "prompting": {k: v for k, v in today["prompting"].items() if k != "interface"}}
    keys = ("prompting",)
    assert identity(upgrade_keys(GenerateConfig, older), keys) == identity(today, keys)
