"""`prompting.loop: original`: the notebook's webthink step (hotpotqa.ipynb), the verbatim
instruction with the paper's exemplars, and the empty-Finish rule of ReAct -> CoT-SC.

    .venv/bin/python -m pytest tests/test_original_loop.py -q
"""

from __future__ import annotations

import hashlib

import pytest
from episode_testdata import build_small_index

from pipeline.agent.scheduler import run_episodes
from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import Trajectory
from pipeline.llm.scripted import ScriptedLLM
from pipeline.methods import MethodSettings, build_method
from pipeline.methods.base import Outcome
from pipeline.methods.composed import no_answer
from pipeline.methods.prompts import load_prompt
from pipeline.tasks import get_task
from pipeline.tasks.hotpotqa.questions import Question
from pipeline.wiki.index import LocalIndex

PAGES = [{"title": "Milhouse Van Houten", "sentences": [
    "Milhouse Van Houten is a character.", " He was named after Richard Nixon."]}]
QUESTION = Question(id="q1", question="Who was Milhouse named after?", answer="Richard Nixon")


@pytest.fixture(scope="module")
def index_path(tmp_path_factory):
    return build_small_index(tmp_path_factory.mktemp("wiki"), PAGES)


def run(index_path, outputs, loop="original", max_new_tokens=100):
    llm = ScriptedLLM(list(outputs))
    settings = MethodSettings(exemplars="none", style="zero_shot", loop=loop, max_new_tokens=max_new_tokens)
    records = []
    with LocalIndex(index_path) as index:
        index.observation_style = "original"
        run_episodes(llm, lambda: index, [QUESTION], build_method("react", settings), records.append,
                     teacher="scripted")
    return records[0], llm


def test_a_thought_without_action_is_asked_again_for_the_action(index_path):
    record, llm = run(index_path, [
        " I need to search Milhouse.\nMaybe more thinking.",  # no "\nAction 1: "
        " Search[Milhouse Van Houten]",  # the re-ask
        " He was named after Nixon.\nAction 2: Finish[Richard Nixon]",
    ])
    assert llm.prompts[1].endswith("Thought 1: I need to search Milhouse.\nAction 1:")
    assert record["end_reason"] == "finish" and record["em"] == 1.0
    assert record["steps"][0]["thought"] == "I need to search Milhouse."
    assert record["steps"][0]["action"] == "Search[Milhouse Van Houten]"


def test_running_out_of_tokens_re_asks_instead_of_ending(index_path):
    long_thought = " " + " ".join(["word"] * 30)
    record, llm = run(index_path, [long_thought, " Finish[Richard Nixon]"], max_new_tokens=10)
    assert len(llm.prompts) == 2 and llm.prompts[1].endswith("\nAction 1:")
    assert record["end_reason"] == "finish"
    ours, _ = run(index_path, [long_thought], loop="ours", max_new_tokens=10)
    assert ours["end_reason"] == "runaway"


def test_the_re_ask_stops_at_a_newline(index_path):
    requests = []

    def responder(prompt, request):
        requests.append(request)
        return " thinking only" if len(requests) == 1 else " Finish[Richard Nixon]\nmore"

    llm = ScriptedLLM(responder)
    settings = MethodSettings(exemplars="none", style="zero_shot", loop="original", max_new_tokens=100)
    with LocalIndex(index_path) as index:
        run_episodes(llm, lambda: index, [QUESTION], build_method("react", settings), None, teacher="s")
    assert requests[0].stop == ["\nObservation 1:"] and requests[1].stop == ["\n"]
    assert requests[1].max_new_tokens == 100


def test_an_empty_re_asked_action_ends_with_no_action(index_path):
    record, _ = run(index_path, [" thinking only", " "])
    assert record["end_reason"] == "no_action" and record["prediction"] is None


def test_a_lenient_action_is_invalid_in_the_original_environment(index_path):
    record, _ = run(index_path, [" Search.\nAction 1: SEARCH [Milhouse Van Houten]",
                                 " Give up.\nAction 2: Finish[Richard Nixon]"])
    assert record["steps"][0]["observation"] == "Invalid action: sEARCH [Milhouse Van Houten]"


def test_the_paper_exemplars_come_with_the_notebook_instruction_verbatim(shared_data):
    prefix = load_prompt("react", str(shared_data / "react" / "prompts_naive.json"))
    notebook = get_task("hotpotqa").paper_instruction("react")  # hotpotqa.ipynb's instruction
    assert prefix.instruction == notebook
    # sha256 of hotpotqa.ipynb's `instruction` string, computed from the notebook itself
    assert hashlib.sha256(notebook.encode()).hexdigest() == (
        "e876b72e2e1682222edbc4277ce1a0c32317363a0067c33f43b4dd6bdb756d85")
    assert prefix.text.startswith(notebook + "\nQuestion: What is the elevation range")
    assert load_prompt("react", "ours").instruction != notebook


def test_an_empty_finish_counts_as_no_answer_for_the_fallback():
    traj = Trajectory("q", "react")
    assert no_answer(Outcome(traj, None, "step_limit"))
    assert no_answer(Outcome(traj, "", "finish")) and no_answer(Outcome(traj, "  ", "finish"))
    assert not no_answer(Outcome(traj, "Nixon", "finish"))


def test_an_unknown_loop_is_refused():
    with pytest.raises(PipelineError, match="unknown loop 'fancy'"):
        build_method("react", MethodSettings(loop="fancy"))
