"""The messages layout (pipeline/core/messages.py): every SFT dataset also as chat messages with
tool calls, its reader, and TRL's own SFTTrainer training on it as written.

    .venv/bin/python -m pytest tests/test_messages.py -q
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipeline.core.messages import NotToolCalls, from_messages, to_messages, tool_call, tool_schemas
from pipeline.core.storage import read_jsonl, write_manifest
from pipeline.core.trajectory import Step, Trajectory, render
from pipeline.stages.filter import FilterConfig, run_filter

REPO = Path(__file__).resolve().parents[1]
FIREACT = REPO.parent / "shared" / "data" / "fireact"
needs_fireact = pytest.mark.skipif(not FIREACT.is_dir(), reason=f"FireAct's release not found at {FIREACT}")
FORMATS = ("standard", "cot", "act", "react")
# sha256 of each train.jsonl and failed.jsonl that `filter` wrote from `text_layout_inputs` at
# 6f422f4, the commit before the messages layout existed: the text layout must stay byte for byte.
TEXT_LAYOUT_AT_6F422F4 = {
    "act/failed.jsonl": "a942b7fdb1dc0148c93a5fbb6779aef9caaa2562ee3af6d098a8f9a40fa53e5a",
    "act/train.jsonl": "3aa4ad6a24b274946f1aa01981e5674ea3f2efd1810c9c5648bd91408a85d423",
    "cot/failed.jsonl": "04dea949a0410987e939c07966a8f5e0bf970600b700fa2ff46b6d81431f4497",
    "cot/train.jsonl": "b54432b2d6f12243558610653991244cb9bed3ec56496f2bba8bd97c8f5dac52",
    "react/failed.jsonl": "c399452b72c76471323d93498f3ce287ee8b1474dff0a730433df6846d008495",
    "react/train.jsonl": "686fdf27a841a5f21151ee4b2cb008e542ec77d61f54498a49cef0531f679de3",
    "standard/failed.jsonl": "27421d7a2d54e4192a296c2df5eaa8a1c5ac58f025748388102c396a5e1d68d0",
    "standard/train.jsonl": "034eabc18680c53b0db8e8921f0d6a67715e64ab7030e88dec7499d69a67f5af",
}


def episode(qid: str, fmt: str, *, em: float = 1.0, note: str = "") -> dict:
    """One episode record (docs/formats.md) of a made-up question whose answer is Paris."""
    question = f"Where is thing {qid}?{note}"
    if fmt in ("act", "react"):
        steps = [Step("I should search it." if fmt == "react" else None, f"Search[thing {qid}]",
                      f"Thing {qid} is in Paris. It is old."),
                 Step("So it is Paris." if fmt == "react" else None, "Finish[Paris]", "Episode finished, reward = 1")]
        traj = Trajectory(question, fmt, steps, "Paris")
    else:
        traj = Trajectory(question, fmt, [], "Paris", "It is in Paris." if fmt == "cot" else None)
    return {"id": qid, "question": question, "gold_answer": "Paris", "method": fmt, "teacher": "oracle",
            "prediction": "Paris", "em": em, "f1": em, "finished": True, "end_reason": "finish",
            "n_steps": len(traj.steps), "steps": [vars(s) for s in traj.steps], "trajectory": traj.to_dict(),
            "text": render(traj).text, "prompt_tokens": 10, "completion_tokens": 20, "seconds": 0.1,
            "source": "generate"}


def text_layout_inputs(root: Path) -> FilterConfig:
    """Made-up episodes of the four formats (one wrong each, odd characters in some) and FireAct's
    released multimethod chats (real GPT-4 text: CoT and ReAct), as one filter run."""
    gen = root / "gen"
    gen.mkdir(parents=True)
    for fmt in FORMATS:
        rows = [episode(f"q{i}", fmt, note=" é “quoted”" if i % 2 else "", em=0.0 if i == 3 else 1.0) for i in range(6)]
        (gen / f"{fmt}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in rows))
    write_manifest(gen / "manifest.json", stage="generate", config={}, complete=True)
    return FilterConfig(inputs=[str(gen)], fireact=[str(FIREACT / "gpt_format" / "hotpotqa_multimethod.jsonl")],
                        out_dir=str(root / "sft"))


@needs_fireact
def test_the_text_layout_is_unchanged_byte_for_byte(tmp_path):
    cfg = text_layout_inputs(tmp_path)
    run_filter(cfg)
    written = {str(p.relative_to(cfg.out_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
               for name in ("train.jsonl", "failed.jsonl") for p in Path(cfg.out_dir).glob(f"*/{name}")}
    assert written == TEXT_LAYOUT_AT_6F422F4


@pytest.fixture(scope="module")
def both_layouts(tmp_path_factory) -> Path:
    """One filter run over `text_layout_inputs`: every format's folder with both layouts."""
    if not FIREACT.is_dir():
        pytest.skip(f"FireAct's release not found at {FIREACT}")
    cfg = text_layout_inputs(tmp_path_factory.mktemp("layouts"))
    run_filter(cfg)
    return Path(cfg.out_dir)


# ---------------------------------------------------------------- writing the layout


def test_react_and_act_are_tool_calls_ending_in_the_finish_call():
    traj = Trajectory("Where is X?", "react", [Step("I search X.", "search[ X ]", "X is in\nParis."),
                                                Step("So Paris.", "Finish[Paris]", "Episode finished, reward = 1")], "Paris")
    call = {"type": "function"}
    assert to_messages(traj, system="Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Question: Where is X?"},
        {"role": "assistant", "content": "I search X.",
         "tool_calls": [{"id": "call_1", **call, "function": {"name": "search", "arguments": {"entity": "X"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "search", "content": "X is in Paris."},  # one line, as rendered
        {"role": "assistant", "content": "So Paris.",
         "tool_calls": [{"id": "call_2", **call, "function": {"name": "finish", "arguments": {"answer": "Paris"}}}]},
    ]  # the finish observation is not written: the episode ends at the call
    act = to_messages(Trajectory("Where is X?", "act", [Step(None, "Search[X]", "X."), Step(None, "Finish[Paris]", "done")]))
    assert [(m["role"], m["content"]) for m in act] == [("user", "Question: Where is X?"), ("assistant", ""),
                                                        ("tool", "X."), ("assistant", "")]


def test_standard_and_cot_are_plain_answers():
    cot = Trajectory("Where is X?", "cot", [], "Paris", "X is\nin Paris.")
    assert to_messages(cot)[1:] == [{"role": "assistant", "content": "Let's think step by step. X is in Paris.\nAnswer: Paris"}]
    assert to_messages(Trajectory("Where is X?", "standard", [], "Paris"))[1:] == [{"role": "assistant", "content": "Paris"}]
    assert from_messages(to_messages(cot)) == (Trajectory("Where is X?", "cot", [], "Paris", "X is in Paris."), None)
    standard = Trajectory("Where is X?", "standard", [], "Paris")
    assert from_messages(to_messages(standard)) == (standard, None)


def test_fever_claims_and_the_label_enum():
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tool_schemas(("SUPPORTS", "REFUTES", "NOT ENOUGH INFO"))}
    assert schemas["finish"]["properties"]["answer"]["enum"] == ["SUPPORTS", "REFUTES", "NOT ENOUGH INFO"]
    assert "enum" not in {k for t in tool_schemas() for k in t["function"]["parameters"]["properties"].get("answer", {})}
    claim = Trajectory("Paris is in France.", "react", [Step("Check.", "Search[Paris]", "Paris is in France."),
                                                        Step("True.", "Finish[not enough  info.]", None)],
                       "not enough info.", question_label="Claim")
    messages = to_messages(claim, answer_space=("SUPPORTS", "REFUTES", "NOT ENOUGH INFO"))
    assert messages[0] == {"role": "user", "content": "Claim: Paris is in France."}
    assert messages[-1]["tool_calls"][0]["function"]["arguments"] == {"answer": "NOT ENOUGH INFO"}


@pytest.mark.parametrize("action", ["Search Paris", "Think[about it]", "Search[Paris", ""])
def test_an_action_the_environment_refuses_has_no_tool_call(action):
    traj = Trajectory("Q?", "react", [Step("t", action, "Invalid action: x"), Step("t", "Finish[a]", None)], "a")
    with pytest.raises(NotToolCalls) as caught:
        to_messages(traj)
    assert caught.value.reason == "action_not_a_tool"


@needs_fireact
def test_tool_calls_follow_the_environments_action_parser():
    """Every action of FireAct's gpt-format chats, and hard cases, become the call the environment
    would run (pipeline/wiki/actions.py), or no call where it would refuse them."""
    from pipeline.wiki.actions import parse_action

    actions = ["Search[Adam [film]]", " lookup [ x ] ", "FINISH[yes]", "Search Paris", "search[]", "Think[x]", "Finish[a]b"]
    for line in (FIREACT / "gpt_format" / "hotpotqa_multimethod.jsonl").read_text().splitlines():
        for message in json.loads(line)["messages"]:
            actions += [t.split("Action:", 1)[1].strip() for t in (message["content"] or "").split("\n") if t.startswith("Action:")]
    assert len(actions) > 1000
    for action in actions:
        parsed = parse_action(action)
        try:
            function = tool_call(action, "c")["function"]
        except NotToolCalls:
            assert parsed is None, action
            continue
        assert (function["name"], next(iter(function["arguments"].values()))) == (parsed.name, parsed.argument), action


# ---------------------------------------------------------------- filter and publish


def test_filter_writes_the_same_trajectories_in_both_layouts(both_layouts):
    for fmt in FORMATS:
        rows, messages = read_jsonl(both_layouts / fmt / "train.jsonl"), read_jsonl(both_layouts / fmt / "messages.jsonl")
        assert [r["id"] for r in rows] == [m["id"] for m in messages] and rows
        stats = json.loads((both_layouts / fmt / "stats.json").read_text())
        assert stats["messages"] == {"rows": len(rows), "left_out": {}}
        for row, message in zip(rows, messages, strict=True):
            assert set(message) == {"id", "question", "method", "messages", "tools", "answer", "source"}
            traj, finish_result = from_messages(message["messages"])
            text = render(traj).text
            if fmt in ("act", "react"):  # the text layout also holds Finish's observation, the messages end at the call
                assert finish_result is None and traj.steps[-1].observation is None
                assert row["completion"].endswith(f"Observation {len(traj.steps)}: Episode finished, reward = 1\n")
                text += f"Observation {len(traj.steps)}: Episode finished, reward = 1\n"
                assert [t["function"]["name"] for t in message["tools"]] == ["search", "lookup", "finish"]
            else:
                assert message["tools"] == [] and len(message["messages"]) == 2
            assert text == row["prompt"] + row["completion"]
        card = (both_layouts / fmt / "README.md").read_text()
        assert f"`messages.jsonl`: the same {len(rows)} trajectories" in card and 'data_files="messages.jsonl"' in card


def test_datasets_loads_each_layout_from_a_published_folder(both_layouts, tmp_path, monkeypatch):
    from datasets import load_dataset

    from pipeline.stages.publish import PublishConfig, publish

    monkeypatch.delenv("HF_TOKEN", raising=False)
    folder = publish(PublishConfig(dataset=str(both_layouts), out_dir=str(tmp_path / "pub")))["folder"]
    card = (folder / "README.md").read_text()
    assert "config_name: react-messages" in card and "path: react/messages.jsonl" in card and "## Two layouts" in card
    text = load_dataset(str(folder), "react", cache_dir=str(tmp_path / "cache"))["train"]
    chat = load_dataset(str(folder), "react-messages", cache_dir=str(tmp_path / "cache"))["train"]
    assert text.num_rows == chat.num_rows > 500 and text["id"] == chat["id"]
    first = chat[0]
    # the tools' differing argument names come back as written, not merged into one struct
    assert first["messages"] == read_jsonl(folder / "react" / "messages.jsonl")[0]["messages"]
    assert first["tools"] == tool_schemas()
    assert load_dataset(str(folder), "cot-messages", cache_dir=str(tmp_path / "cache"))["train"][0]["messages"][1]["role"] == "assistant"


def test_a_trajectory_with_a_refused_action_stays_in_the_text_layout_only(tmp_path, capsys):
    bad = episode("b", "react")
    bad["trajectory"]["steps"].insert(0, {"thought": "Hmm.", "action": "Search thing b", "observation": "Invalid action: Search thing b"})
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "react.jsonl").write_text(json.dumps(episode("a", "react")) + "\n" + json.dumps(bad) + "\n")
    write_manifest(gen / "manifest.json", stage="generate", config={}, complete=True)
    run_filter(FilterConfig(inputs=[str(gen)], out_dir=str(tmp_path / "sft")))
    folder = tmp_path / "sft" / "react"
    assert len(read_jsonl(folder / "train.jsonl")) == 2 and [m["id"] for m in read_jsonl(folder / "messages.jsonl")] == ["a"]
    assert json.loads((folder / "stats.json").read_text())["messages"] == {"rows": 1, "left_out": {"action_not_a_tool": 1}}
    assert "not in messages.jsonl (no tool-call form): action_not_a_tool 1" in capsys.readouterr().out
    assert 'Left out, having no tool-call form: {"action_not_a_tool": 1}' in (folder / "README.md").read_text()
