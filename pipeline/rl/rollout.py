"""TRL's `rollout_func`: this project's own ReAct / Act loop, one episode per rollout.

    rollout = Rollouts(questions, method, backend, settings, seed=0, log_dir=Path("run/rollouts"))
    GRPOTrainer(..., rollout_func=rollout)       # TRL calls rollout(prompts, trainer)

TRL 1.16 hands the function this process's slice of the step's prompts (each question already
repeated `num_generations` times by its sampler) and expects one rollout per prompt: its
`prompt_ids`, `completion_ids` and `logprobs` (vLLM's per-token ones; None from the transformers
engine, which samples from the trainer's own model), plus any extra fields,
which it passes to the reward functions; `env_mask` (1 = the policy's token, 0 = the
environment's) becomes its tool mask, multiplied into the loss mask.

Each rollout is an episode program of pipeline.methods (Interactive: the loop `eval` runs),
stepped in rounds as pipeline.agent runs them: every waiting episode's next request goes into
one batched generate() call of the policy (pipeline.rl.policy), its WikiEnv steps in between.
The token trace of each episode (pipeline.rl.trace) holds what the policy sampled and what the
loop wrote; its decoded completion is the renderer's trajectory text.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.agent.scheduler import Episode
from pipeline.core.errors import PipelineError
from pipeline.core.storage import atomic_write_text
from pipeline.core.trajectory import render
from pipeline.methods import Method
from pipeline.rl.policy import TokenRequest, transformers_policy, vllm_policy
from pipeline.rl.trace import TokenTrace


@dataclass
class RolloutCounts:
    """Tokens of one rollout batch, for the throughput figures (pipeline.rl.throughput)."""

    prefill: int = 0  # context tokens the policy read to generate (whole contexts: an upper bound with a KV cache)
    generated: int = 0  # tokens the policy sampled
    trained: list[int] = field(default_factory=list)  # prompt + completion length of each rollout
    seconds: float = 0.0


def rollout_seed(seed: int, step: int, index: int, call: int) -> int:
    """A sampling seed per (run seed, optimizer step, rollout's place in the step, its call):
    the same under any batch layout and on resume."""
    return (((seed * 1_000_003 + step) * 1_000_033 + index) * 257 + call) % (2**63 - 1)


class Rollouts:
    """The rollout function (a callable TRL calls with the prompts and itself)."""

    def __init__(self, questions: dict[str, Any], method: Method, backend, *, seed: int,
                 max_batch_size: int, max_context: int | None, engine: str = "transformers",
                 sample_dtype: str = "fp32", log_dir: Path | None = None,
                 on_counts: Callable[[RolloutCounts], None] | None = None):
        self.questions, self.method, self.backend = questions, method, backend
        self.seed, self.max_batch_size, self.max_context, self.engine = seed, max_batch_size, max_context, engine
        self.sample_dtype = sample_dtype  # transformers engine: the weights' dtype while sampling (policy.sampling_weights)
        self.log_dir, self.on_counts = log_dir, on_counts

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        started = time.perf_counter()
        step, rank = trainer.state.global_step, trainer.accelerator.process_index
        offset = rank * len(prompts)  # this slice's place in the step's batch (every process gets as many)
        missing = [p for p in prompts if p not in self.questions]
        if missing:
            raise PipelineError(f"rollout: a prompt that is not a training question's: {missing[0][:80]!r}")
        episodes = [Episode(self.questions[p], self.method, lambda: self.backend) for p in prompts]
        traces = [TokenTrace(trainer.processing_class, p) for p in prompts]
        counts = RolloutCounts()
        with self.policy(trainer) as policy:
            self.run(episodes, traces, policy, step, offset, counts)
        eos = trainer.processing_class.eos_token_id
        for episode, trace in zip(episodes, traces, strict=True):
            trace.finish(render(episode.outcome.trajectory).completion, eos)
        records = [self.record(e, t) for e, t in zip(episodes, traces, strict=True)]
        counts.trained = [len(t.prompt_ids) + len(t.ids) for t in traces]
        counts.seconds = time.perf_counter() - started
        self.report(trainer, records, counts, step, rank)
        return {"prompt_ids": [t.prompt_ids for t in traces], "completion_ids": [t.ids for t in traces],
                "logprobs": self.sampling_logprobs(traces), "env_mask": [t.mask for t in traces],
                "prediction": [r["prediction"] for r in records], "end_reason": [r["end_reason"] for r in records]}

    def sampling_logprobs(self, traces: list[TokenTrace]) -> list[list[float | None]] | None:
        """vLLM's per-token log-probabilities, for TRL's importance-sampling correction
        (`vllm_importance_sampling_correction`, on by default: it subtracts them from the
        trainer's own). The transformers engine samples from the trainer's model itself: None,
        and TRL uses no correction without vLLM."""
        if self.engine != "vllm":
            return None
        return [t.logprobs for t in traces]

    @contextlib.contextmanager
    def policy(self, trainer: Any) -> Iterator[Any]:
        """What generates this batch's tokens: the trainer's model as it is now."""
        if self.engine == "vllm":
            with vllm_policy(trainer, self.max_context) as policy:
                yield policy
            return
        with transformers_policy(trainer, self.max_batch_size, self.max_context,
                                 sample_dtype=self.sample_dtype) as policy:
            yield policy

    def run(self, episodes: list[Episode], traces: list[TokenTrace], policy, step: int, offset: int,
            counts: RolloutCounts) -> None:
        """Rounds: every waiting episode's request in one generate() call, then their steps."""
        calls = [0] * len(episodes)
        collective = getattr(policy, "collective", False)  # vLLM server mode: every process, every round
        while True:
            waiting = [k for k, e in enumerate(episodes) if e.outcome is None]
            if not (policy.any_active(bool(waiting)) if collective else waiting):
                return
            requests = []
            for k in waiting:
                if len(episodes[k].pending) != 1:
                    raise PipelineError(f"rollout: method {self.method.name} asked {len(episodes[k].pending)} "
                                        "completions at once; GRPO runs one-turn-at-a-time loops (react, act)")
                req = episodes[k].pending[0]
                context = traces[k].context(req.prompt)
                fields = {**vars(req), "n": 1, "seed": rollout_seed(self.seed, step, offset + k, calls[k])}
                requests.append(TokenRequest(**fields, prompt_ids=context))
                calls[k] += 1
                counts.prefill += len(context)
            answers = policy.generate(requests)
            for k, [completion] in zip(waiting, answers, strict=True):
                traces[k].add_policy(getattr(completion, "token_ids", []), getattr(completion, "token_logprobs", None))
                counts.generated += len(getattr(completion, "token_ids", []))
                episodes[k].deliver([[completion]])

    def record(self, episode: Episode, trace: TokenTrace) -> dict:
        record = episode.record(teacher="policy", source="grpo")
        policy_tokens = sum(trace.mask)
        record.update(policy_tokens=policy_tokens, env_tokens=len(trace.mask) - policy_tokens,
                      dropped_policy_tokens=trace.dropped_policy_tokens)
        return record

    def report(self, trainer: Any, records: list[dict], counts: RolloutCounts, step: int, rank: int) -> None:
        from pipeline.agent.search_stats import search_stats

        n = len(records)
        for name, value in (("rollout/finish_rate", sum(r["finished"] for r in records) / n),
                            ("rollout/searches", search_stats(records)["searches"] / n),  # GRPO policies settle at 1-2
                            ("rollout/mean_steps", sum(r["n_steps"] for r in records) / n),
                            ("rollout/policy_tokens", sum(r["policy_tokens"] for r in records) / n),
                            ("rollout/env_tokens", sum(r["env_tokens"] for r in records) / n),
                            ("rollout/dropped_policy_tokens", sum(r["dropped_policy_tokens"] for r in records) / n),
                            ("rollout/seconds", counts.seconds)):
            trainer._log_metric(name, value)  # averaged over processes with TRL's own metrics
        if self.on_counts is not None:
            self.on_counts(counts)
        if self.log_dir is not None:
            lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
            # One file per step and rank, rewritten whole: a step re-run after a resume replaces its file.
            atomic_write_text(self.log_dir / f"step-{step + 1:06d}.rank-{rank}.jsonl", lines)

