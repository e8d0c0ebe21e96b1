"""The one renderer: formats match the paper's exemplars; observation spans are exact."""

from __future__ import annotations

import json

import pytest

from pipeline.core.trajectory import Step, Trajectory, parse, render


def test_react_text_and_observation_spans():
    traj = Trajectory("Who?", "react", [
        Step("I need to search X.", "Search[X]", "X is a thing.\nMore."),
        Step("So the answer is Y.", "Finish[Y]", "Episode finished, reward = 1"),
    ], answer="Y")
    r = render(traj)
    assert r.prompt == "Question: Who?\n"
    assert r.completion == (
        "Thought 1: I need to search X.\nAction 1: Search[X]\nObservation 1: X is a thing. More.\n"
        "Thought 2: So the answer is Y.\nAction 2: Finish[Y]\nObservation 2: Episode finished, reward = 1\n"
    )
    assert [r.completion[s:e] for s, e in r.observation_spans] == [
        "X is a thing. More.", "Episode finished, reward = 1"]


def test_standard_cot_act():
    assert render(Trajectory("Q?", "standard", answer="A")).completion == "Answer: A\n"
    cot = render(Trajectory("Q?", "cot", answer="A", reasoning="R."))
    assert cot.completion == "Thought: Let's think step by step. R.\nAnswer: A\n"
    act = render(Trajectory("Q?", "act", [Step(None, "Finish[A]", None)], answer="A"))
    assert act.completion == "Action 1: Finish[A]\n" and act.observation_spans == []
    with pytest.raises(ValueError):
        render(Trajectory("Q?", "bogus"))


@pytest.mark.parametrize("key,method", [("webthink_simple6", "react"), ("webact_simple6", "act"),
                                        ("cotqa_simple6", "cot"), ("webqa_simple6", "standard")])
def test_parse_render_round_trip_on_the_papers_exemplars(shared_data, key, method):
    prompts = json.loads((shared_data / "react" / "prompts_naive.json").read_text())
    blocks = ["Question:" + b for b in prompts[key].split("Question:")[1:]]
    assert len(blocks) == 6
    for block in blocks:
        text = render(parse(block, method)).text
        # equal up to the trailing spaces and wrapped observation lines of the original file
        assert " ".join(text.split()) == " ".join(block.split())


def test_to_dict_writes_format_and_from_dict_reads_it_back():
    traj = Trajectory("Q?", "react", [Step("T.", "Finish[A]", "Episode finished, reward = 1")], answer="A")
    d = traj.to_dict()
    assert d["format"] == "react" and "method" not in d
    assert Trajectory.from_dict(d) == traj


def test_a_trajectory_written_before_the_rename_still_loads():
    """Records written before the rename hold the format under the key "method"."""
    old = {"question": "Q?", "method": "cot", "steps": [], "answer": "A", "reasoning": "R."}
    traj = Trajectory.from_dict(old)
    assert traj.format == "cot" and traj.answer == "A"
    assert render(traj).completion == "Thought: Let's think step by step. R.\nAnswer: A\n"
    with pytest.raises(KeyError):
        Trajectory.from_dict({"question": "Q?", "steps": []})  # neither key: not a trajectory
