"""`python -m pipeline wiki replay`: released trajectories' actions through our environment,
agreement per action kind, on tiny files in each released format.

    .venv/bin/python -m pytest tests/test_wiki_replay.py -q
"""

from __future__ import annotations

import json

import pytest
from episode_testdata import build_small_index, run_pipeline

from pipeline.wiki.index import LocalIndex
from pipeline.wiki.replay import read_trajectories, replay

PAGES = [{"title": "Milhouse Van Houten", "text": [
    ["Milhouse Van Houten is a character. He is ten."],
    ["He was named after Richard Nixon. Nixon's middle name was Milhous."]]}]
EXACT_HIT = "Milhouse Van Houten is a character. He is ten.. He was named after Richard Nixon. Nixon's middle name was Milhous.."
REACT_TEXT = (
    "\nQuestion: Who was Milhouse named after?\n"
    "Thought 1: Search it.\nAction 1: Search[Milhouse Van Houten]\nObservation 1: " + EXACT_HIT + "\n"
    "Thought 2: Look up.\nAction 2: Lookup[named after]\n"
    "Observation 2: (Result 1 / 1) Milhouse was named after U.S. president Richard Nixon.\n"
    "Thought 3: Done.\nAction 3: Finish[Richard Nixon]\n"
    "\nQuestion: Where is Nowhere?\n"
    "Thought 1: Search.\nAction 1: Search[Nowhere Land]\n"
    "Observation 1: Could not find Nowhere Land. Similar: ['Nowhere Man'].\n"
    "Thought 2: Bad.\nAction 2: Jump[high]\nObservation 2: Invalid action: jump[high]\n"
)


@pytest.fixture(scope="module")
def index_path(tmp_path_factory):
    return build_small_index(tmp_path_factory.mktemp("wiki"), PAGES)


@pytest.fixture
def files(tmp_path):
    prompts = tmp_path / "prompts_naive.json"
    prompts.write_text(json.dumps({"webthink_simple6": REACT_TEXT, "cotqa_simple6": "Question: x\nAnswer: y\n"}))
    fever = tmp_path / "fever_trajs.jsonl"
    fever.write_text(json.dumps({"claim": "Milhouse exists.", "traj": (
        "Thought 1: s\nAction 1: Search[Milhouse Van Houten]\nObservation 1: Pages for logged out editors "
        "learn more. Milhouse Van Houten is a character. He is ten in 2022.\n\nThought 2: f\n"
        "Action 2: Finish[SUPPORTS]\nObservation 2: Episode finished, reward = 1\n")}) + "\n")
    fireact = tmp_path / "hotpotqa.json"
    fireact.write_text(json.dumps([{"instruction": "q", "input": "", "output": (
        "Thought: s\nAction: search[Milhouse Van Houten]\nObservation: Milhouse is a Simpsons character ...\n"
        "Thought: f\nAction: finish[x]\nObservation: Episode finished, reward = True\n")}]))
    return prompts, fever, fireact


def test_readers_pair_actions_with_observations(files):
    prompts, fever, fireact = files
    react = list(read_trajectories(prompts))
    assert [r.source for r in react] == ["prompts_naive.json#webthink_simple6"] * 2
    assert react[0].steps[1] == ("Lookup[named after]", "(Result 1 / 1) Milhouse was named after U.S. president Richard Nixon.")
    assert react[1].steps[-1] == ("Jump[high]", "Invalid action: jump[high]")
    assert list(read_trajectories(fever))[0].steps[0][0] == "Search[Milhouse Van Houten]"
    assert list(read_trajectories(fireact))[0].steps[0][1] == "Milhouse is a Simpsons character ..."


def test_agreement_per_action_kind(index_path, files):
    with LocalIndex(index_path) as index:
        rows = {(r["source"], r["kind"]): r for r in replay(index, list(files), "original").rows()}
    search = rows[("prompts_naive.json#webthink_simple6", "search")]
    # the hit is identical; the miss agrees on hit/miss and first sentence but not on Similar
    assert (search["n"], search["same_outcome_pct"], search["identical_pct"]) == (2, 100.0, 50.0)
    assert search["same_first_sentence_pct"] == 100.0 and search["both_found"] == 1
    lookup = rows[("prompts_naive.json#webthink_simple6", "lookup")]
    assert (lookup["n"], lookup["same_outcome_pct"], lookup["same_first_sentence_pct"]) == (1, 100.0, 0.0)
    invalid = rows[("prompts_naive.json#webthink_simple6", "invalid")]
    assert invalid["identical_pct"] == 100.0
    fever = rows[("fever_trajs.jsonl", "search")]  # page chrome dropped before the first sentence
    assert (fever["same_first_sentence_pct"], fever["identical_pct"]) == (100.0, 0.0)
    assert rows[("hotpotqa.json", "search")]["same_outcome_pct"] == 100.0
    assert not any(kind == "finish" for _, kind in rows)


def test_the_cli_prints_the_table_and_refuses_a_bad_file(index_path, files, tmp_path):
    proc = run_pipeline("wiki", "replay", "--index", str(index_path), str(files[0]), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    assert "| prompts_naive.json#webthink_simple6 (2 traj.) | search | 2 | 100.0% |" in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())["style"] == "original"
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    proc = run_pipeline("wiki", "replay", "--index", str(index_path), str(bad))
    assert proc.returncode == 2 and "not a ReAct prompts file" in proc.stderr
