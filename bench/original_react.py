"""The baseline the batched runner is measured and tested against: ReAct written the way the
original notebook's `webthink()` is (a plain loop over questions and steps, one model call at a
time). It restates the interactive methods' episode-ending rules on purpose, as an independent
reference: `pipeline.agent.scheduler.run_episodes` must match it trajectory for trajectory
(tests/test_agent.py, bench/bench_generate.py). It is not part of the package.

    from bench.original_react import original_react_loop
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from pipeline.agent.scheduler import BackendFactory, episode_record
from pipeline.core.trajectory import Step, Trajectory, one_line, render
from pipeline.llm.base import LLM, Completion, GenerationRequest
from pipeline.methods.base import Outcome, backend_errors, completion_failure
from pipeline.methods.interactive import split_thought_action
from pipeline.methods.prompts import PromptPrefix
from pipeline.tasks import get_task
from pipeline.wiki.actions import env_action
from pipeline.wiki.env import WikiEnv


def original_react_loop(llm: LLM, make_backend: BackendFactory, questions: Iterable[Any],
                        prefix: PromptPrefix, *, max_steps: int = 7, max_new_tokens: int = 256,
                        teacher: str | None = None, source: str = "generate") -> list[dict]:
    """ReAct written the way the original notebook's `webthink()` is: a plain loop over questions
    and steps, one model call at a time (batch 1). Kept as the baseline that `run_episodes` must
    match trajectory for trajectory (tests, bench/bench_generate.py); same end reasons."""
    records = []
    for question in questions:
        started, tokens = time.monotonic(), [0, 0]

        def llm_call(prompt: str, stop: list[str], tokens: list[int] = tokens) -> Completion:
            [[c]] = llm.generate([GenerationRequest(prompt, stop, max_new_tokens)])
            tokens[0] += c.prompt_tokens
            tokens[1] += c.completion_tokens
            return c

        env = WikiEnv(make_backend(), max_steps=max_steps, score=get_task("hotpotqa").scores)
        text = one_line(question.question)
        env.reset(text, question.answer)
        traj = Trajectory(text, "react")
        outcome = None
        for i in range(1, max_steps + 1):
            prompt = prefix.text + render(traj).text
            c = llm_call(prompt + f"Thought {i}:", [f"\nObservation {i}:"])
            if completion_failure(c):
                outcome = Outcome(traj, None, completion_failure(c))
                break
            thought, action = split_thought_action(c.text, i)
            if action is not None and c.finish_reason == "length" and c.text.rstrip().endswith(action):
                traj.steps.append(Step(thought, action))
                outcome = Outcome(traj, None, "runaway")
                break
            if action is None:
                if c.finish_reason == "length":
                    traj.steps.append(Step(thought, ""))
                    outcome = Outcome(traj, None, "runaway")
                    break
                c = llm_call(prompt + f"Thought {i}: {thought}\nAction {i}:", ["\n"])
                action = c.text.strip()
                reason = completion_failure(c) or ("runaway" if c.finish_reason == "length" else None) \
                    or (None if action else "no_action")
                if reason:
                    traj.steps.append(Step(thought, "" if completion_failure(c) else one_line(action)))
                    outcome = Outcome(traj, None, reason)
                    break
            step = Step(thought, action)
            traj.steps.append(step)
            try:
                obs, _, done, info = env.step(env_action(action))
            except backend_errors() as exc:
                outcome = Outcome(traj, None, f"backend_error: {type(exc).__name__}: {exc}")
                break
            step.observation = one_line(obs.replace("\\n", ""))
            if info["finished"]:
                traj.answer = info["answer"]
                outcome = Outcome(traj, info["answer"], "finish")
                break
            if done:
                break
        outcome = outcome or Outcome(traj, None, "step_limit")
        records.append(episode_record(question, "react", outcome, teacher=teacher or llm.name,
                                      prompt_tokens=tokens[0], completion_tokens=tokens[1],
                                      seconds=time.monotonic() - started, source=source))
    return records
