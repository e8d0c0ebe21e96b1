"""What every prompting method shares: settings, the episode context, the outcome, and the
generator protocol that lets one runner drive many episodes at once.

A method's `run(ctx)` is a generator (an "episode program"). Each time it needs the model it
yields a list of GenerationRequests and is sent back, for each request, its list of
Completions; when the episode is over it returns an Outcome. The program never calls the LLM
itself, so `pipeline.agent.scheduler` can gather the requests of every waiting episode into ONE
`llm.generate()` call per round, or drive a single episode with batch-1 calls; both see the same
completions and produce the same trajectory under greedy decoding. Environment steps happen
inside the program, each episode against its own WikiEnv.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pipeline.core.config import at_least, checked, in_range
from pipeline.core.errors import BackendFailure
from pipeline.core.trajectory import Step, Trajectory, one_line
from pipeline.llm.base import Completion, GenerationRequest
from pipeline.wiki.actions import env_action
from pipeline.wiki.env import WikiEnv

Program = Generator[list[GenerationRequest], list[list[Completion]], "Outcome"]


@dataclass
class MethodSettings:
    """How a method prompts: the `prompting:` block of a stage config (`prompting.max_steps=7`)."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {"mode": "style"}  # old key -> new (pipeline.core.config)
    # a serving library's names of our keys: their did-you-mean (pipeline.core.config)
    SYNONYMS: ClassVar[dict[str, tuple[str, str]]] = {"max_tokens": ("max_new_tokens", "vLLM's and OpenAI's")}
    # a manifest written before `interface` existed ran the text interface (pipeline.core.config.upgrade_keys)
    UPGRADE_OLD: ClassVar = staticmethod(lambda settings: {"interface": "text", **settings})

    style: str = "prompt"  # prompt (instruction + exemplars + question) | zero_shot (question alone) | fireact
    exemplars: str = "ours"  # ours | paper | a prompts_naive.json path | a folder of ours
    max_steps: int = at_least(1, default=7)  # Act / ReAct step limit (the paper's: 7; its FEVER hybrids use 5, pipeline.tasks)
    max_new_tokens: int = at_least(1, default=256)  # per generation (the original notebook: 100)
    # ours | original. original: the notebook's webthink loop, rule for rule (see
    # pipeline/methods/interactive.py); pair it with wiki.observation_style=original
    loop: str = "ours"
    temperature: float = checked(in_range(0), default=0.0)  # greedy, as in the paper (CoT-SC samples use cot_sc_temperature)
    cot_sc_samples: int = at_least(1, default=21)
    cot_sc_temperature: float = checked(in_range(0), default=0.7)  # samples CoT-SC's votes
    seed: int = at_least(0, default=0)  # mixed with each question id into the request seed (sampling only)
    # text | tools. tools: Act and ReAct act through native tool calls of an OpenAI-compatible chat
    # endpoint (`backend: openai`), the conversation as messages (pipeline/methods/tool_calling.py)
    interface: str = "text"


@dataclass
class EpisodeContext:
    """One episode's inputs. `question` is one of a task's questions (anything with id / question
    / answer: a HotpotQA question, a FEVER claim; HotpotQA's oracle also reads supporting_facts).
    `make_env` gives a WikiEnv that scores a Finish with the method's task."""

    question: Any
    make_env: Callable[[], WikiEnv]

    @property
    def text(self) -> str:
        """The question as the trajectory holds it: one line, as the renderer writes it."""
        return one_line(self.question.question)


@dataclass
class Outcome:
    trajectory: Trajectory  # in the format that produced the prediction
    prediction: str | None  # None: the episode gave no answer
    end_reason: str  # finish | step_limit | no_action | context_exceeded | runaway | llm_error: ... | backend_error: ...
    details: dict = field(default_factory=dict)  # method-internal facts (votes, fallback), not recorded


class Method(Protocol):
    name: str  # standard | cot | cot_sc | act | react | react_to_cot_sc | cot_sc_to_react
    settings: MethodSettings
    task: Any  # the pipeline.tasks.Task its prompts are for; its records are scored by it

    def run(self, ctx: EpisodeContext) -> Program:
        """The episode program (see the module docstring)."""


# Failures of the page source (local SQLite, a live API) end ONE episode with
# `backend_error: ...`; anything else (a bug in our code) still raises.
def backend_errors() -> tuple[type[BaseException], ...]:
    return (BackendFailure, sqlite3.Error, OSError)


# End reasons of an episode that a failing model or page source ended (not the model's own
# doing): they are counted against `max_error_share` and retried when the run is re-run.
ERROR_ENDINGS = ("llm_error:", "backend_error:")


def ended_in_error(end_reason: str | None) -> bool:
    """Whether an episode's end reason says a backend (model or page source) failed it."""
    return isinstance(end_reason, str) and end_reason.startswith(ERROR_ENDINGS)


def step_env(env: WikiEnv, traj: Trajectory, command: str) -> tuple[str | None, Outcome | None]:
    """Send one action to the environment: (its observation, the Outcome when the episode ends
    there: answered or at the step limit; else None). A failing page source gives no observation
    and the `backend_error` Outcome."""
    try:
        observation, _, done, info = env.step(command)
    except backend_errors() as exc:
        return None, Outcome(traj, None, f"backend_error: {type(exc).__name__}: {exc}")
    if info["finished"]:
        traj.answer = info["answer"]
        return observation, Outcome(traj, info["answer"], "finish")
    return observation, (Outcome(traj, None, "step_limit") if done else None)


def take_step(env: WikiEnv, traj: Trajectory, step: Step) -> Outcome | None:
    """Append `step` to `traj`, send its action to `env` and keep the observation on the step: the
    Outcome when the episode ends there (answered, at the step limit, a failing page source), else
    None. The one place an agent loop's step meets the environment (text and tool-call loops)."""
    traj.steps.append(step)
    observation, ended = step_env(env, traj, env_action(step.action))
    if observation is not None:
        step.observation = one_line(observation.replace("\\n", ""))
    return ended


def completion_failure(c: Completion) -> str | None:
    """The end reason a failed completion implies, or None when it is usable text."""
    if c.finish_reason != "error":
        return None
    error = c.error or "unknown error"
    lowered = error.lower()
    if "context" in lowered or "too long" in lowered or "maximum length" in lowered:
        return "context_exceeded"
    return f"llm_error: {error}"


def episode_seed(question_id: str, seed: int) -> int:
    """A stable per-question seed, so sampled methods are reproducible in any batch order."""
    return (zlib.crc32(str(question_id).encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF


def seed_requests(requests: list[GenerationRequest], episode_id: str, seed: int, made: int) -> int:
    """Give each sampled request (temperature > 0) that has no seed of its own one drawn from the
    episode's id (a sample's `<question id>#<j>`: pipeline.sampling), the settings' seed and the
    request's number in the episode, so that a sampled episode draws the same tokens in any batch
    and on resume, and k samples of one question draw different ones. Returns the requests made so far."""
    for r in requests:
        made += 1
        if r.temperature > 0 and r.seed is None:
            r.seed = episode_seed(f"{episode_id}:{made}", seed)
    return made


def request(prompt: str, stop: list[str], settings: MethodSettings, *, n: int = 1,
            temperature: float | None = None, seed: int | None = None) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, stop=stop, max_new_tokens=settings.max_new_tokens,
                             temperature=settings.temperature if temperature is None else temperature,
                             n=n, seed=seed)
