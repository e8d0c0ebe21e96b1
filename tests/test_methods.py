"""Prompts, exemplars and the parsing rules of each method.

    .venv/bin/python -m pytest tests/test_methods.py
"""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import Trajectory, parse, render
from pipeline.llm.base import Completion
from pipeline.methods import METHOD_NAMES, MethodSettings, build_method, prompt_prefixes
from pipeline.methods.base import Outcome, completion_failure
from pipeline.methods.build_exemplars import build, check, check_questions, load_authored
from pipeline.methods.composed import majority
from pipeline.methods.direct import parse_direct
from pipeline.methods.interactive import split_thought_action
from pipeline.methods.prompts import load_our_exemplars, load_prompt, paper_prefix
from pipeline.tasks import get_task
from pipeline.wiki.actions import env_action

HOTPOTQA = get_task("hotpotqa")
EXEMPLAR_DIR, PAPER_KEYS = HOTPOTQA.exemplar_dir, HOTPOTQA.paper_keys


@pytest.fixture(scope="module")
def wiki_index(shared_data, tmp_path_factory):
    from pipeline.wiki.index import LocalIndex, build_index

    path = tmp_path_factory.mktemp("wiki") / "index.sqlite"
    build_index([shared_data / "wiki" / "corpus.jsonl"], path)
    return LocalIndex(path)


def test_paper_exemplars_are_used_verbatim(shared_data):
    path = shared_data / "react" / "prompts_naive.json"
    raw = json.loads(path.read_text())
    for fmt, key in PAPER_KEYS.items():
        prefix = paper_prefix(fmt, path)
        assert prefix.exemplars.rstrip("\n") == raw[key].rstrip("\n")
        assert prefix.text.endswith("\n") and prefix.source == f"paper:{path}#{key}"
        assert prefix.exemplars.count("Question: ") == 6
    react = paper_prefix("react", path)
    assert "Search[entity]" in react.instruction and "Lookup[keyword]" in react.instruction
    assert react.exemplars.startswith("\nQuestion: What is the elevation range")


def test_bad_exemplar_sources_fail_with_one_line(tmp_path):
    bad = tmp_path / "prompts.json"
    bad.write_text(json.dumps({"webthink_simple": "x"}))
    with pytest.raises(PipelineError, match="no 'webthink_simple6' exemplars"):
        paper_prefix("react", bad)
    bad.write_text("{not json")
    with pytest.raises(PipelineError, match="not valid JSON"):
        paper_prefix("react", bad)
    with pytest.raises(PipelineError, match="exemplars 'nowhere'"):
        load_prompt("react", "nowhere")
    with pytest.raises(PipelineError, match="unknown method 'reactt'"):
        build_method("reactt")
    with pytest.raises(PipelineError, match="unknown prompting style"):  # the key was `mode`
        build_method("react", MethodSettings(style="chat"))
    with pytest.raises(PipelineError, match="exemplar file missing"):
        load_our_exemplars("react", tmp_path)


def test_our_exemplars_render_six_per_format_and_reparse():
    for fmt in ("standard", "cot", "act", "react"):
        records = load_our_exemplars(fmt, EXEMPLAR_DIR)
        assert len(records) == 6 and len({r["id"] for r in records}) == 6
        prefix = load_prompt(fmt, "ours")
        for rec in records:
            traj = Trajectory.from_dict(rec["trajectory"])
            text = render(traj).text
            assert text in prefix.text
            assert parse(text, fmt) == traj  # the renderer's own text parses back to the same trajectory
            if fmt in ("act", "react"):
                assert traj.steps[-1].action == f"Finish[{rec['gold_answer']}]"
                assert traj.steps[-1].observation == "Episode finished, reward = 1"
    # The four formats are ablations of the same six questions.
    ids = [[r["id"] for r in load_our_exemplars(fmt, EXEMPLAR_DIR)] for fmt in ("standard", "cot", "act", "react")]
    assert ids[0] == ids[1] == ids[2] == ids[3]


def test_our_exemplar_observations_match_the_environment(wiki_index):
    """Replaying the authored actions over the real index reproduces the stored files exactly."""
    assert check(wiki_index, EXEMPLAR_DIR) == []
    react = build(wiki_index, load_authored())["react"]
    observations = [s["observation"] for r in react for s in r["trajectory"]["steps"]]
    assert any(o.startswith("Could not find Schenectady. Similar: [") for o in observations)
    assert any(o.startswith("(Result 1 / 1) ") for o in observations)


def test_exemplars_come_from_the_bootstrap_pool(shared_data):
    assert check_questions(load_authored()) == []


def test_prompt_prefixes_per_method(shared_data):
    paper = str(shared_data / "react" / "prompts_naive.json")
    p = prompt_prefixes("react_to_cot_sc", MethodSettings(exemplars=paper))
    assert set(p) == {"react", "cot"} and p["cot"].source.endswith("#cotqa_simple6")
    zero = prompt_prefixes("cot_sc_to_react", MethodSettings(style="zero_shot"))
    assert all(z.text == "" and z.source == "none" for z in zero.values())
    for name in METHOD_NAMES:
        assert build_method(name, MethodSettings(exemplars=paper)).name == name


def test_split_thought_action_follows_the_original_split():
    assert split_thought_action(" I need X.\nAction 2: Search[X]", 2) == ("I need X.", "Search[X]")
    # No action: the thought is the first line, as the original's except-branch takes it.
    assert split_thought_action(" I need X.\nmore words", 1) == ("I need X.", None)
    assert split_thought_action(" Thought.\nAction 1: ", 1) == ("Thought.", None)
    # Several actions: the first line after "Action i: " is the action.
    assert split_thought_action(" T\nAction 1: Search[A]\nThought 2: U\nAction 2: Search[B]", 1) == ("T", "Search[A]")
    assert split_thought_action(" T\nAction 3: Search[A]", 1) == ("T\nAction 3: Search[A]".split("\n")[0], None)
    assert env_action("Search[X]") == "search[X]" and env_action("") == ""


def test_parse_direct_answers_and_failures():
    q = "Who?"
    ok = parse_direct(Completion(" Let's think step by step. A is B.\nAnswer: Richard Nixon\n"), "cot", q)
    assert (ok.prediction, ok.end_reason, ok.trajectory.reasoning) == ("Richard Nixon", "finish", "A is B.")
    assert render(ok.trajectory).completion == "Thought: Let's think step by step. A is B.\nAnswer: Richard Nixon\n"
    std = parse_direct(Completion(" Paris\nextra"), "standard", q)
    assert (std.prediction, std.trajectory.answer) == ("Paris", "Paris")
    assert parse_direct(Completion(" Let's think. no answer line"), "cot", q).end_reason == "no_action"
    assert parse_direct(Completion(" blah" * 50, finish_reason="length"), "cot", q).end_reason == "runaway"
    assert parse_direct(Completion(" Paris and on and on", finish_reason="length"), "standard", q).end_reason == "runaway"
    assert parse_direct(Completion(" \n"), "standard", q).end_reason == "no_action"
    err = Completion("", finish_reason="error", error="context window exceeded: 9000 > 8192 tokens")
    assert parse_direct(err, "standard", q).end_reason == "context_exceeded"
    assert completion_failure(Completion("", finish_reason="error", error="HTTP 500")) == "llm_error: HTTP 500"
    assert completion_failure(Completion("x", finish_reason="length")) is None


def test_majority_vote_normalises_answers():
    def o(answer):
        return Outcome(Trajectory("q", "cot", answer=answer), answer, "finish" if answer else "no_action")

    winner, votes = majority([o("The Beatles"), o("Rolling Stones"), o("beatles"), o("the beatles!"), o(None)])
    assert (winner.prediction, votes) == ("The Beatles", 3)
    loser, none = majority([o(None), o(None)])
    assert (loser.end_reason, none) == ("no_action", 0)


def test_the_registry_has_one_distinct_row_per_method(shared_data):
    """One row per method (pipeline.methods.registry): a unique name, label and look in the
    figure, formats a student can be trained on, and a row the method is really built from."""
    from pipeline.core.trajectory import FORMATS
    from pipeline.methods.registry import METHODS, method_spec

    assert METHOD_NAMES == tuple(spec.name for spec in METHODS)
    for key in (lambda s: s.name, lambda s: s.label, lambda s: (s.color, s.marker)):
        assert len({key(spec) for spec in METHODS}) == len(METHODS)
    paper = str(shared_data / "react" / "prompts_naive.json")
    for spec in METHODS:
        assert spec.formats and set(spec.formats) <= set(FORMATS), spec.name
        assert set(prompt_prefixes(spec.name, MethodSettings(exemplars=paper))) == set(spec.formats)
        assert method_spec(spec.name) is spec
    with pytest.raises(PipelineError, match="unknown method 'nope'; expected one of standard, cot, cot_sc"):
        method_spec("nope")
