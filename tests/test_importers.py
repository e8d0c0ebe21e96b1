"""FireAct importers: released trajectories -> our episode records, eval runs -> summary rows.

    .venv/bin/python -m pytest tests/test_importers.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import Trajectory, parse, render
from pipeline.hub.importers import (
    Skip,
    fireact_episode,
    fireact_run_model,
    parse_fireact_text,
    question_id,
    read_fireact_eval_run,
    read_fireact_trajectories,
)

REPO = Path(__file__).resolve().parents[1]
FIREACT = REPO.parent / "shared" / "data" / "fireact"
needs_fireact = pytest.mark.skipif(not FIREACT.is_dir(), reason="FireAct data not present at ../shared/data/fireact")

REACT_TEXT = (
    "Thought: I need to search X.\nAction: search[X]\nObservation: X is a band from Y ...\n"
    "Thought: So the answer is Y.\nAction: finish[Y]\nObservation: Episode finished, reward = True\n"
)


# ---------------------------------------------------------------- synthetic trajectories


def test_react_text_becomes_numbered_capitalised_and_keeps_observations():
    episode = fireact_episode("Where is X from?", REACT_TEXT, source="fireact:test.json")
    assert episode["method"] == "react" and episode["em"] == 1.0 and episode["finished"]
    assert episode["gold_answer"] is None and "by construction" in episode["em_source"]
    assert "Google" in episode["observation_source"]
    assert episode["text"] == (
        "Question: Where is X from?\nThought 1: I need to search X.\nAction 1: Search[X]\n"
        "Observation 1: X is a band from Y ...\nThought 2: So the answer is Y.\nAction 2: Finish[Y]\n"
        "Observation 2: Episode finished, reward = 1\n"
    )
    # the record's trajectory round-trips through the one renderer
    traj = Trajectory.from_dict(episode["trajectory"])
    assert render(traj).text == episode["text"]
    assert parse(episode["text"], "react").answer == "Y" == episode["prediction"]
    assert episode["id"] == question_id("where is   X from?")


def test_reward_false_is_imported_as_incorrect():
    episode = fireact_episode("Q?", REACT_TEXT.replace("reward = True", "reward = False"), source="s")
    assert episode["em"] == 0.0 and episode["f1"] == 0.0
    assert episode["steps"][-1]["observation"] == "Episode finished, reward = 0"


def test_shapes_map_to_cot_act_react():
    cot = "Thought: A is B. So C.\nAction: finish[C]\nObservation: Episode finished, reward = 1"
    episode = fireact_episode("Q?", cot, source="s", multimethod=True)
    assert episode["method"] == "cot" and episode["steps"] == [] and episode["n_steps"] == 0
    assert episode["text"] == "Question: Q?\nThought: Let's think step by step. A is B. So C.\nAnswer: C\n"
    # FireAct's ReAct runner logs reward = True: a one-step ReAct run in a multimethod file stays ReAct
    one_step_react = cot.replace("reward = 1", "reward = True")
    assert fireact_episode("Q?", one_step_react, source="s", multimethod=True)["method"] == "react"
    # outside a multimethod file every thought-bearing trajectory is ReAct
    assert fireact_episode("Q?", cot, source="s")["method"] == "react"
    act = "Action: search[X]\nObservation: X is Y.\nAction: lookup[born]\nObservation: (Result 1 / 1) born 1900.\n" \
          "Action: finish[1900]\nObservation: Episode finished, reward = 1"
    episode = fireact_episode("Q?", act, source="s")
    assert episode["method"] == "act" and episode["n_steps"] == 3
    assert "Action 2: Lookup[born]\nObservation 2: (Result 1 / 1) born 1900.\n" in episode["text"]
    assert "Thought" not in episode["text"]


@pytest.mark.parametrize("text, reason", [
    ("Thought: a\nAction: search[x]\nObservation: o\nAction: finish[y]\nObservation: Episode finished, reward = 1",
     "mixed_thoughts"),
    ("Thought: a\nAction: click[x]\nObservation: o\nThought: b\nAction: finish[y]\nObservation: Episode finished, reward = 1",
     "unknown_action"),
    ("Thought: a\nAction: finish[x]\nObservation: Episode finished, reward = 0\nThought: b\nAction: finish[y]\n"
     "Observation: Episode finished, reward = 1", "finish_not_last"),
    ("Thought: a\nAction: search[x]\nObservation: o", "no_finish"),
    ("Thought: a\nAction: search[x]\nThought: b\nAction: finish[y]\nObservation: Episode finished, reward = 1",
     "malformed"),
    ("Thought: a\nAction: search[x]\nObservation: o\nThought: b\nAction: finish[y]", "malformed"),
    ("Thought: a\nAction: search x\nObservation: o", "malformed_action"),
    ("Thought: Now that I haven't solved the task within 5 steps, let me do a reflection and think. Thought: b\n"
     "Action: finish[y]\nObservation: Episode finished, reward = 1", "reflexion"),
    ("Action: finish[y]\nObservation: Episode finished, reward = 1", "finish_without_thought_or_search"),
    ("Thought: a\nAction: finish[y]\nObservation: Done", "bad_finish_observation"),
])
def test_unmappable_shapes_are_skipped_with_a_reason(text, reason):
    with pytest.raises(Skip) as caught:
        fireact_episode("Q?", text, source="s", multimethod=True)
    assert caught.value.reason == reason


def test_continuation_lines_and_preamble():
    preamble, steps = parse_fireact_text("A. red\nB. blue\nThought: line one\nline two\nAction: finish[B]\n"
                                         "Observation: Episode finished, reward = 1")
    assert preamble == "A. red\nB. blue"
    assert steps[0].thought == "line one\nline two" and steps[0].action == "finish[B]"
    episode = fireact_episode("Which colour?", "A. red\nB. blue\nThought: line one\nline two\nAction: finish[B]\n"
                              "Observation: Episode finished, reward = 1", source="s")
    assert episode["question"] == "Which colour?\nA. red\nB. blue"
    assert "Question: Which colour? A. red B. blue\nThought 1: line one line two\n" in episode["text"]


def _write_gpt(path: Path, rows: list[list[tuple[str, str]]]) -> None:
    path.write_text("".join(json.dumps({"messages": [{"role": r, "content": c} for r, c in row]}) + "\n"
                            for row in rows))


def test_gpt_format_and_multitask_task_filter(tmp_path):
    react = [("user", "Where is X from?"), ("assistant", "Thought: I need to search X.\nAction: search[X]"),
             ("user", "Observation: X is a band from Y ..."), ("assistant", "Thought: So the answer is Y.\nAction: finish[Y]"),
             ("user", "Observation: Episode finished, reward = True")]
    other = [("user", "Is the sky green?"), ("assistant", "Thought: no.\nAction: finish[no]"),
             ("user", "Observation: Episode finished, reward = 1")]
    headless = [("assistant", "Is it?\nAction: finish[Thought: x]"), ("user", "Observation: Episode finished, reward = 1")]
    folder = tmp_path / "gpt_format"
    folder.mkdir()
    _write_gpt(folder / "multitask.jsonl", [react, other, headless])
    with pytest.raises(PipelineError, match="multitask"):
        read_fireact_trajectories(folder / "multitask.jsonl")
    _write_gpt(folder / "hotpotqa.jsonl", [react])
    episodes, report = read_fireact_trajectories(folder / "multitask.jsonl")
    assert [e["question"] for e in episodes] == ["Where is X from?"]
    assert episodes[0]["text"] == fireact_episode("Where is X from?", REACT_TEXT, source="s")["text"]
    assert episodes[0]["source"] == "fireact:gpt_format/multitask.jsonl"
    assert report.seen == 3 and dict(report.skipped) == {"not_hotpotqa": 1, "no_question": 1}
    episodes, report = read_fireact_trajectories(folder / "multitask.jsonl", other_tasks=True)
    assert len(episodes) == 2 and dict(report.kept) == {"react": 2}


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(PipelineError, match="not found"):
        read_fireact_trajectories(tmp_path / "missing.json")
    (tmp_path / "hotpotqa.json").write_text('{"not": "a list"}')
    with pytest.raises(PipelineError, match="alpaca"):
        read_fireact_trajectories(tmp_path / "hotpotqa.json")


# ---------------------------------------------------------------- eval runs


def test_run_model_from_file_name():
    assert fireact_run_model("hotpotqa_dev_0_500_llama_models_lora_llama-2-7b-d_1000_0.7_2023-09-19-00-49-36") == \
        ("Llama-2-7B (FireAct LoRA)", "7b", 7.0)
    model, size_class, params_b = fireact_run_model(
        "hotpotqa_dev_0_500_ft_gpt-3.5-turbo-0613_princeton-nlp__7woQRsdi_0.0_2023-09-21-16-19-51")
    assert model.startswith("gpt-3.5-turbo-0613") and params_b is None and size_class == "undisclosed"
    with pytest.raises(PipelineError, match="cannot tell the model"):
        fireact_run_model("some_run")


def test_eval_run_recomputes_em_and_refuses_disagreement(tmp_path):
    path = tmp_path / "hotpotqa_dev_0_500_llama_models_lora_llama-2-13b-d_1000_0.7_2023-09-18-13-40-08.json"
    records = {
        "1": {"reward": True, "em": True, "f1": 1.0, "gt": "The Beatles", "pred": "beatles", "prompt": "",
              "traj": "Thought: x\nAction: search[a]\nObservation: o\nThought: y\nAction: finish[beatles]\nObservation: ok"},
        "2": {"reward": False, "em": False, "f1": 0.0, "gt": "yes", "pred": "no", "prompt": "",
              "traj": "Thought: x\nAction: search[a]\nObservation: o"},
    }
    path.write_text(json.dumps(records))
    row = read_fireact_eval_run(path)
    assert row["model"] == "Llama-2-13B (FireAct LoRA)" and row["params_b"] == 13.0
    assert (row["n"], row["em"], row["f1"], row["finish_rate"], row["mean_steps"]) == (2, 0.5, 0.5, 0.5, 1.5)
    assert row["mode"] == "finetune" and row["method"] == "react" and row["question_set"] == "react-dev500"
    assert row["em_over_500"] == 1 / 500
    records["2"]["em"] = True
    path.write_text(json.dumps(records))
    with pytest.raises(PipelineError, match="recomputed EM"):
        read_fireact_eval_run(path)


# ---------------------------------------------------------------- the real release


@needs_fireact
def test_real_hotpotqa_alpaca_and_gpt_agree():
    alpaca, report = read_fireact_trajectories(FIREACT / "alpaca_format" / "hotpotqa.json")
    gpt, _ = read_fireact_trajectories(FIREACT / "gpt_format" / "hotpotqa.jsonl")
    assert report.seen == 500 and dict(report.kept) == {"react": 500} and not report.skipped
    assert sorted(e["text"] for e in alpaca) == sorted(e["text"] for e in gpt)
    raw = json.loads((FIREACT / "alpaca_format" / "hotpotqa.json").read_text())
    for episode in alpaca:
        source = raw[episode["fireact_index"]]["output"]
        assert episode["em"] == 1.0 and episode["source"] == "fireact:alpaca_format/hotpotqa.json"
        assert all(s["action"].split("[")[0] in ("Search", "Lookup", "Finish") for s in episode["steps"])
        for step in episode["steps"][:-1]:  # snippets verbatim (a Google snippet is one line)
            assert f"Observation: {step['observation']}\n" in source
        assert "Thought 1: " in episode["text"] and "\nsearch[" not in episode["text"]


@needs_fireact
def test_real_multimethod_maps_cot_and_skips_reflexion():
    episodes, report = read_fireact_trajectories(FIREACT / "alpaca_format" / "hotpotqa_multimethod.json")
    assert report.seen == 734
    assert dict(report.kept) == {"react": 500, "cot": 186}
    assert dict(report.skipped) == {"reflexion": 47, "finish_without_thought_or_search": 1}
    cot = [e for e in episodes if e["method"] == "cot"]
    assert all(e["text"].count("\n") == 3 and "Answer: " in e["text"] for e in cot)


@needs_fireact
def test_real_multitask_keeps_only_hotpotqa():
    episodes, report = read_fireact_trajectories(FIREACT / "alpaca_format" / "multitask.json")
    assert report.seen == 1344 and report.skipped["not_hotpotqa"] == 844 and len(episodes) == 500


@needs_fireact
def test_real_eval_runs_match_the_reported_em():
    runs = {p.name: p for p in (FIREACT / "trajs").glob("*.json")}
    seven = read_fireact_eval_run(next(p for n, p in runs.items() if "llama-2-7b" in n))
    thirteen = read_fireact_eval_run(next(p for n, p in runs.items() if "llama-2-13b" in n))
    assert seven["n"] == 500 and round(seven["em"], 3) == 0.262  # paper: 26.2
    # 13B: 172 correct of the 499 records released = 0.345 (data README); over 500 = 0.344 (FireAct)
    assert thirteen["n"] == 499 and round(thirteen["em"], 3) == 0.345 and round(thirteen["em_over_500"], 3) == 0.344
    assert seven["params_b"] == 7.0 and thirteen["params_b"] == 13.0


@needs_fireact
def test_cli_runs_and_trajectories(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "pipeline.hub.importers", "runs", str(FIREACT / "trajs"), "-o", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 3 and {r["source"] for r in rows} == {"fireact"}
    proc = subprocess.run([sys.executable, "-m", "pipeline.hub.importers", "runs", str(tmp_path / "nope"), "-o", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")
