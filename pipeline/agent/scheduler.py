"""Run many episodes at once, scheduled in rounds or continuously (chosen by the backend).

    from pipeline.agent.scheduler import run_episodes
    from pipeline.methods import MethodSettings, build_method
    method = build_method("react", MethodSettings())
    records = run_episodes(llm, lambda: LocalIndex(path), questions, method, on_record=sink)

Each episode is a method's program (pipeline.methods.base): it yields the requests it needs and
steps its own WikiEnv, which scores a Finish with the method's task (pipeline.tasks), as the
record is scored. Two schedules drive the programs; `schedule_for(llm)` picks one:

- rounds (in-process batch backends: transformers, vLLM's offline engine, the scripted model): a
  round gathers the pending requests of all episodes in flight into ONE `llm.generate()` call,
  hands each episode its completions, and starts the next round when the whole batch is back.
- continuous (backends that declare `continuous_batching = True`: the OpenAI-compatible HTTP
  backend, whose server batches requests as they arrive): each episode sends its next request
  as soon as its last one returns, so a fast episode never waits for a slow one. Each episode
  has one generate() call out at a time, so at most `max_in_flight` calls are out at once.

In both, finished episodes are retired at once (their record goes to `on_record`, always from the
calling thread) and new episodes join up to `max_in_flight`; the programs and their WikiEnv steps
also run in the calling thread (a SQLite connection stays in its thread). An episode's trajectory
depends only on its own completions, so under greedy decoding it is the same under either
schedule and in a one-at-a-time loop (`run_one_at_a_time`, or bench/original_react.py, the
original notebook's loop shape); only the order in which records finish may differ.

A model failure (an error completion, or generate() raising) or a page-source failure ends only
the episodes it touched, with the reason in `end_reason`; the others go on (generate and eval
stop a run once too many end so: `max_error_share`, pipeline.agent.episodes). Anything else that
raises (a backend bug, a record that cannot be written) ends the run with that error; the records
written so far stay, and a re-run resumes after them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import render
from pipeline.llm.base import LLM, Completion, GenerationRequest
from pipeline.methods.base import (
    EpisodeContext,
    Method,
    Outcome,
    seed_requests,
)
from pipeline.tasks import Task
from pipeline.wiki.backend import WikiBackend
from pipeline.wiki.env import WikiEnv

RecordCallback = Callable[[dict], None]
BackendFactory = Callable[[], WikiBackend]
SCHEDULES = ("rounds", "continuous")


def episode_record(question: Any, method: str, outcome: Outcome, *, teacher: str, prompt_tokens: int = 0,
                   completion_tokens: int = 0, seconds: float = 0.0, source: str = "generate",
                   task: Task | None = None) -> dict:
    """The episode record (one JSON line per finished episode; docs/formats.md),
    its `em` / `f1` by `task` (a pipeline.tasks Task; default HotpotQA): for FEVER `em` is accuracy."""
    from pipeline.sampling import record_fields
    from pipeline.tasks import get_task

    traj, prediction, gold = outcome.trajectory, outcome.prediction, question.answer
    scores = get_task(task).scores(prediction, gold)
    return {
        "id": str(question.id),
        **record_fields(question),  # a sample of a question (pipeline.sampling): question_id, sample
        "question": question.question,
        "gold_answer": gold,
        "method": method,
        "teacher": teacher,
        "prediction": prediction,
        "em": scores["em"] if prediction is not None else 0.0,
        "f1": scores["f1"] if prediction is not None else 0.0,
        "finished": prediction is not None,
        "end_reason": outcome.end_reason,
        "n_steps": len(traj.steps),
        "steps": [asdict(s) for s in traj.steps],
        "trajectory": traj.to_dict(),
        "text": render(traj).text,
        "prompt_tokens": int(prompt_tokens),
        "completion_tokens": int(completion_tokens),
        "seconds": round(seconds, 3),
        "source": source,
    }


class Episode:
    """One question's program in flight, with its token counts and clock."""

    def __init__(self, question: Any, method: Method, make_backend: BackendFactory):
        max_steps, score = method.settings.max_steps, method.task.scores
        ctx = EpisodeContext(question, lambda: WikiEnv(make_backend(), max_steps=max_steps, score=score))
        self.question, self.method = question, method
        self.program = method.run(ctx)
        self.started = time.monotonic()
        self.prompt_tokens = self.completion_tokens = 0
        self.requests_made = 0  # numbers each sampled request's seed (seed_requests)
        self.pending: list[GenerationRequest] = []
        self.outcome: Outcome | None = None
        self._resume(None)

    def deliver(self, completions: list[list[Completion]]) -> None:
        for samples in completions:
            # Every sample of one request was conditioned on the same prompt: count it once.
            self.prompt_tokens += samples[0].prompt_tokens if samples else 0
            self.completion_tokens += sum(c.completion_tokens for c in samples)
        self._resume(completions)

    def _resume(self, value: list[list[Completion]] | None) -> None:
        try:
            self.pending = self.program.send(value)
        except StopIteration as stop:
            self.outcome, self.pending = stop.value, []
            return
        if not self.pending:
            raise RuntimeError(f"method {self.method.name} yielded no requests")
        self.requests_made = seed_requests(self.pending, str(self.question.id), self.method.settings.seed,
                                           self.requests_made)

    def record(self, teacher: str, source: str) -> dict:
        return episode_record(self.question, self.method.name, self.outcome, teacher=teacher,
                              prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                              seconds=time.monotonic() - self.started, source=source, task=self.method.task)


def schedule_for(llm: LLM | None) -> str:
    """The one rule: a backend that declares `continuous_batching = True` (it hands each request to a
    server that batches requests as they arrive: the OpenAI-compatible backend) is driven
    continuously; every other backend (a static batch per generate() call, in this process) in rounds."""
    return "continuous" if getattr(llm, "continuous_batching", False) else "rounds"


def run_episodes(llm: LLM | None, make_backend: BackendFactory, questions: Iterable[Any], method: Method,
                 on_record: RecordCallback | None = None, *, teacher: str | None = None,
                 max_in_flight: int = 64, source: str = "generate", schedule: str | None = None) -> list[dict]:
    """Run `method` on every question, up to `max_in_flight` episodes at once; call
    `on_record(record)` as each finishes; return the records in finishing order.

    `make_backend()` is called once per episode that uses the environment (return a shared
    LocalIndex from it to share one connection). `llm` may be None for methods that never ask a
    model (the oracle). `teacher` defaults to `llm.name`. `schedule` (rounds | continuous)
    defaults to `schedule_for(llm)`; benchmarks and tests set it to compare the two."""
    if max_in_flight < 1:
        raise PipelineError(f"max_in_flight must be >= 1, got {max_in_flight}")
    schedule = schedule or schedule_for(llm)
    if schedule not in SCHEDULES:
        raise PipelineError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    run = EpisodeRun(llm, make_backend, questions, method, on_record,
                     teacher=teacher or (llm.name if llm is not None else "none"), source=source)
    if schedule == "continuous":
        return run_continuously(run, max_in_flight)
    return run_in_rounds(run, max_in_flight)


class EpisodeRun:
    """What both schedules share: the questions still to start, and retiring finished episodes."""

    def __init__(self, llm: LLM | None, make_backend: BackendFactory, questions: Iterable[Any], method: Method,
                 on_record: RecordCallback | None, *, teacher: str, source: str):
        self.llm, self.make_backend, self.method = llm, make_backend, method
        self.on_record, self.teacher, self.source = on_record, teacher, source
        self.questions = iter(questions)
        self.records: list[dict] = []

    def start(self) -> Episode | None:
        """The next question's episode, still waiting for the model; None when none is left.
        Episodes that finish without asking the model (the oracle) are retired on the way."""
        for question in self.questions:
            episode = Episode(question, self.method, self.make_backend)
            if episode.outcome is None:
                if self.llm is None:
                    raise PipelineError(f"method {self.method.name} needs a language model but none was given")
                return episode
            self.retire(episode)
        return None

    def retire(self, episode: Episode) -> None:
        record = episode.record(self.teacher, self.source)
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)


def run_in_rounds(run: EpisodeRun, max_in_flight: int) -> list[dict]:
    """One generate() call per round for the pending requests of every episode in flight."""
    in_flight: list[Episode] = []

    def admit() -> None:
        while len(in_flight) < max_in_flight and (episode := run.start()) is not None:
            in_flight.append(episode)

    admit()
    while in_flight:
        results = generate_for(run.llm, in_flight)
        still: list[Episode] = []
        for episode, completions in zip(in_flight, results, strict=True):
            episode.deliver(completions)
            if episode.outcome is not None:
                run.retire(episode)
            else:
                still.append(episode)
        in_flight[:] = still
        admit()
    return run.records


def run_continuously(run: EpisodeRun, max_in_flight: int) -> list[dict]:
    """Each episode's next generate() call goes out as soon as its last one is back. The calls
    wait in worker threads (one per episode in flight); everything else happens here."""
    out: dict[Future, Episode] = {}
    pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="episode")

    def send(episode: Episode) -> None:
        out[pool.submit(generate_for, run.llm, [episode])] = episode

    def admit() -> None:
        while len(out) < max_in_flight and (episode := run.start()) is not None:
            send(episode)

    try:
        admit()
        while out:
            done, _ = wait(out, return_when=FIRST_COMPLETED)
            for future in [f for f in out if f in done]:  # in the order they were sent
                episode = out.pop(future)
                episode.deliver(future.result()[0])  # a backend bug raised in the worker raises here
                if episode.outcome is not None:
                    run.retire(episode)
                else:
                    send(episode)
            admit()
    finally:
        # On an error, stop here: calls already sent finish in their threads, their answers unused
        # (as a round's generate() would have); the episodes they belong to rerun on resume.
        pool.shutdown(wait=not out, cancel_futures=True)
    return run.records


def run_one_at_a_time(llm: LLM | None, make_backend: BackendFactory, questions: Iterable[Any], method: Method,
                      on_record: RecordCallback | None = None, *, teacher: str | None = None,
                      source: str = "generate") -> list[dict]:
    """The same episodes, one after another, each model call with a batch of one request."""
    records: list[dict] = []
    for question in questions:
        records += run_episodes(_BatchOfOne(llm) if llm is not None else None, make_backend, [question],
                                method, on_record, teacher=teacher or (llm.name if llm else None),
                                max_in_flight=1, source=source)
    return records


class _BatchOfOne:
    def __init__(self, llm: LLM):
        self.llm, self.name = llm, llm.name

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        return [self.llm.generate([r])[0] for r in requests]


def generate_for(llm: LLM, episodes: list[Episode]) -> list[list[list[Completion]]]:
    """One generate() call for the pending requests of `episodes`, split back per episode.
    If the call raises, each episode is asked alone, so the error ends only the episodes whose
    own call fails (as an error completion -> `llm_error: ...` / `context_exceeded`)."""
    flat = [r for ep in episodes for r in ep.pending]
    try:
        out = llm.generate(flat)
    except Exception as exc:  # a backend must not raise (LLM protocol); contain it if it does
        if len(episodes) == 1:
            error = f"{type(exc).__name__}: {exc}"
            return [[[Completion("", finish_reason="error", error=error)] * r.n for r in flat]]
        return [generate_for(llm, [ep])[0] for ep in episodes]
    if len(out) != len(flat) or any(len(c) != r.n for c, r in zip(out, flat, strict=True)):
        raise PipelineError(f"LLM backend {llm.name} returned {len(out)} results for {len(flat)} requests "
                            "(or the wrong number of samples): a backend bug")
    split, offset = [], 0
    for ep in episodes:
        split.append(out[offset:offset + len(ep.pending)])
        offset += len(ep.pending)
    return split
