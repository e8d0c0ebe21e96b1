"""ScriptedLLM: the offline stand-in for a model in agent tests.

    .venv/bin/python -m pytest tests/test_llm_scripted.py
"""

from __future__ import annotations

from pipeline.llm.base import GenerationRequest
from pipeline.llm.scripted import ScriptedLLM


def test_responder_output_is_cut_at_the_stop_string_like_a_model():
    def responder(prompt, request):
        step = prompt.count("Observation") + 1
        return f" I search.\nAction {step}: Search[X]\nObservation {step}: made up by the model"

    llm = ScriptedLLM(responder)
    out = llm.generate([GenerationRequest("Question: q\nThought 1:", stop=["\nObservation 1:"]),
                        GenerationRequest("...Observation 1: x\nThought 2:", stop=["\nObservation 2:"])])
    assert out[0][0].text == " I search.\nAction 1: Search[X]" and out[0][0].finish_reason == "stop"
    assert out[1][0].text == " I search.\nAction 2: Search[X]"
    assert out[0][0].completion_tokens == 5 and out[0][0].prompt_tokens == 4  # whitespace words


def test_canned_outputs_in_order_then_exhausted_error():
    llm = ScriptedLLM(["one\nstop here", "two"], name="canned")
    first = llm.generate([GenerationRequest("p1", stop=["\n"])])
    second = llm.generate([GenerationRequest("p2"), GenerationRequest("p3")])
    assert llm.name == "canned"
    assert first[0][0].text == "one"
    assert second[0][0].text == "two"
    assert second[1][0].finish_reason == "error" and "exhausted" in second[1][0].error


def test_counts_calls_batches_samples_and_runaway_length():
    llm = ScriptedLLM(lambda prompt, request: "a b c d e f")
    out = llm.generate([GenerationRequest("x", n=3, max_new_tokens=4), GenerationRequest("y")])
    llm.generate([GenerationRequest("z")])
    assert llm.calls == 2 and llm.batch_sizes == [2, 1] and llm.prompts == ["x", "x", "x", "y", "z"]
    assert [c.text for c in out[0]] == ["a b c d"] * 3
    assert out[0][0].finish_reason == "length" and out[0][0].completion_tokens == 4
    assert out[1][0].text == "a b c d e f" and out[1][0].finish_reason == "stop"
