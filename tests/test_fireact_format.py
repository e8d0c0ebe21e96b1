"""FireAct's format (pipeline.methods.fireact) against FireAct's released files: the prompt we build
for a question is the text its fine-tuning data was built from, and its eval runs' full texts are
what our episode program writes when fed the same model outputs and observations.

    .venv/bin/python -m pytest tests/test_fireact_format.py -q
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipeline.core.trajectory import Step, Trajectory
from pipeline.llm.scripted import ScriptedLLM
from pipeline.methods import MethodSettings, build_method
from pipeline.methods.base import EpisodeContext
from pipeline.methods.fireact import (
    MAX_ITERATIONS,
    STOP,
    alpaca_prompt,
    env_action,
    parse,
    render,
    split_output,
)


def generate_prompt(record: dict) -> str:
    """FireAct's finetune/llama_lora/finetune.py `generate_prompt`, for records with an empty input
    (every HotpotQA record): the text each training example was built from."""
    return ("Below is an instruction that describes a task. Write a response that appropriately completes "
            f"the request.\n\n### Instruction:\n{record['instruction']}\n\n### Response:\n{record['output']}")


@pytest.fixture(scope="module")
def alpaca(shared_data):
    return json.loads((shared_data / "fireact" / "alpaca_format" / "hotpotqa.json").read_text())


@pytest.fixture(scope="module")
def eval_run(shared_data):
    [path] = (shared_data / "fireact" / "trajs").glob("*llama-2-7b*.json")
    return json.loads(path.read_text())


def test_our_prompt_for_a_question_is_the_text_fireacts_training_data_was_built_from(alpaca):
    assert all(r["input"] == "" for r in alpaca)
    trailing = 0
    for record in alpaca:
        training_text = generate_prompt(record)
        question = record["instruction"]
        ours = alpaca_prompt(question)
        if question != question.rstrip():
            # FireAct trained on the question as stored but prompts with `question.rstrip()`
            # (generation.py prepare_prompt): we build the inference prompt.
            trailing += 1
            assert training_text.startswith(ours[: -len("\n\n### Response:\n")].rstrip())
            continue
        assert training_text.startswith(ours)
        assert ours + record["output"] == training_text
    assert trailing == 26 and len(alpaca) == 500


def test_rendering_a_parsed_training_record_gives_its_text_back(alpaca):
    for record in alpaca[:200]:
        text = generate_prompt(record)
        if record["instruction"] != record["instruction"].rstrip():
            continue
        traj = parse(text)
        assert traj.format == "react" and traj.steps[-1].action.startswith("finish[")
        assert render(traj).text == text


def test_our_trajectories_render_with_lower_case_actions_and_boolean_rewards():
    traj = Trajectory("Which city?", "react", [
        Step("I search.", "Search[Paris]", "Paris is the capital of France."),
        Step("Done.", "Finish[Paris]", "Episode finished, reward = 1")], answer="Paris")
    rendered = render(traj)
    assert rendered.completion == ("Thought: I search.\nAction: search[Paris]\nObservation: Paris is the capital of "
                                   "France.\nThought: Done.\nAction: finish[Paris]\nObservation: Episode finished, "
                                   "reward = True\n")
    assert [rendered.completion[a:b] for a, b in rendered.observation_spans] == \
        ["Paris is the capital of France.", "Episode finished, reward = True"]
    with pytest.raises(ValueError):
        render(Trajectory("q", "act"))


class ReplayEnv:
    """A stand-in environment: it answers each action with the observation FireAct recorded
    (Google-search snippets), so the episode program can be checked against a released run."""

    def __init__(self, steps: list[Step]):
        self.steps, self.i = steps, 0

    def reset(self, question, gold_answer=None):
        return question

    def step(self, action):
        recorded = self.steps[self.i]
        self.i += 1
        assert action == env_action(recorded.action)
        finished = recorded.action.startswith("finish[")
        reward = finished and recorded.observation.endswith("True")
        observation = f"Episode finished, reward = {int(reward)}" if finished else recorded.observation
        return observation, float(reward), finished, {"finished": finished, "answer": action[7:-1] if finished else None}


def run_program(method, question: str, env, outputs: list[str]):
    canned = list(outputs)
    llm = ScriptedLLM(lambda prompt, request: (llm.stops.append(request.stop), canned.pop(0))[1])
    llm.stops = []
    ctx = EpisodeContext(SimpleNamespace(id="q", question=question, answer="x"), lambda: env)
    program = method.run(ctx)
    requests = program.send(None)
    try:
        while True:
            requests = program.send(llm.generate(requests))
    except StopIteration as stop:
        return stop.value, llm


def test_the_episode_program_rebuilds_fireacts_released_eval_texts(eval_run):
    """Fed the released run's thoughts/actions as model outputs and its observations through a
    replay environment, our program's final text equals FireAct's logged text for each record,
    and each prompt it sent is that text cut before a step, plus `Thought:`."""
    method = build_method("react", MethodSettings(style="fireact"))
    assert method.settings.max_steps == MAX_ITERATIONS == 11
    checked = 0
    for record in list(eval_run.values())[:60]:
        traj = parse(record["traj"])
        if any("\n" in (s.thought + s.action) or not s.thought for s in traj.steps):
            continue  # the few multi-line outputs came from FireAct's no-stop retries
        outputs = [f" {s.thought}\nAction: {s.action}" for s in traj.steps]
        outcome, llm = run_program(method, traj.question, ReplayEnv(traj.steps), outputs)
        assert render(outcome.trajectory).text == record["traj"]
        assert outcome.end_reason == "finish"
        for i, prompt in enumerate(llm.prompts):
            assert prompt == render(Trajectory(traj.question, "react", traj.steps[:i])).text + "Thought:"
        checked += 1
    assert checked >= 50


def test_stop_strings_iteration_limit_and_the_action_repair(index):
    """Through the real environment (local index): lower-case actions reach it, a thought
    without an action is repaired by asking for the action alone, and 11 iterations end it."""
    from pipeline.wiki.env import WikiEnv
    from pipeline.wiki.index import LocalIndex

    method = build_method("react", MethodSettings(style="fireact"))
    env = WikiEnv(LocalIndex(index), max_steps=method.settings.max_steps, score=method.task.scores)
    outputs = [" I should look it up.", "search[Milhouse Van Houten]"] + [" Again.\nAction: search[Milhouse]"] * 10
    outcome, llm = run_program(method, "Who is Milhouse named after?", env, outputs)
    assert outcome.end_reason == "step_limit" and len(outcome.trajectory.steps) == MAX_ITERATIONS
    assert llm.prompts[1].endswith("Thought: I should look it up.\nAction:")
    first = outcome.trajectory.steps[0]
    assert (first.thought, first.action) == ("I should look it up.", "search[Milhouse Van Houten]")
    assert "Milhouse" in first.observation and not first.observation.startswith("Invalid action")
    assert STOP == ["\nObservation:"] and llm.stops == [STOP] * (MAX_ITERATIONS + 1)


def test_output_splitting_follows_fireacts_loop():
    assert split_output(" I know.\nAction: finish[Paris]") == ("I know.", "finish[Paris]")
    assert split_output("Thought: twice cued\nAction: search[x]") == ("twice cued", "search[x]")
    assert split_output("Action: search[x]") == ("", "search[x]")
    assert split_output(" only a thought\nmore") == (" only a thought".strip(), None)
    assert env_action("search[Paris]") == "search[Paris]"
    assert env_action("Finish[Paris]") == "finish[Paris]"
    assert env_action("no bracket") is None


def test_fireacts_format_runs_react_only():
    from pipeline.core.errors import PipelineError

    with pytest.raises(PipelineError, match="FireAct's format is ReAct only"):
        build_method("cot", MethodSettings(style="fireact"))
