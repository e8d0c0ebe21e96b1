"""A GRPO run resolved once into one plan, as pipeline/train/plan.py resolves an SFT run: the
task, the rollouts' batch split, where the policy starts, the student's keys that `train` shares,
and the training questions. The stage (`python -m pipeline grpo`) builds it before launching, to
refuse now what the launched script would refuse later; the script (pipeline.rl.train) builds it
from the same resolved config and trains from it. Each piece is resolved the first time it is
asked for and kept: a dry run resolves the batch split alone, a finished run returns before it
reads its questions.

    plan = plan_grpo(cfg, world_size=2)
    plan.batch.per_device, plan.start.kind, len(plan.questions.rows), plan.task.name
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.rl.config import GrpoConfig
from pipeline.rl.start import StartPoint, resolve_start
from pipeline.tasks import Task, get_task
from pipeline.train.config import FinetuneConfig
from pipeline.train.sft import split_batch


@dataclass
class BatchPlan:
    """rollouts per step = per_device x accumulation x processes (one generation per step)."""

    per_device: int
    grad_accum: int
    num_processes: int


@dataclass
class TrainingQuestions:
    by_prompt: dict[str, Any]  # the prompt TRL hands the rollout function -> its question
    rows: list[dict]  # the dataset TRL samples: prompt, answer, question_id


def batch_plan(cfg: GrpoConfig, num_processes: int) -> BatchPlan:
    if cfg.rollouts_per_step % num_processes:
        raise PipelineError(f"{cfg.rollouts_per_step} rollouts per step (questions_per_step x group_size) do not divide "
                            f"over {num_processes} processes; make questions_per_step x group_size a multiple of "
                            f"{num_processes}")
    per_device, accum = split_batch(cfg.rollouts_per_step, num_processes, cfg.per_device_batch_size,
                                    cfg.max_per_device_batch_size, batch_name="questions_per_step x group_size")
    return BatchPlan(per_device, accum, num_processes)


@dataclass
class RlPlan:
    cfg: GrpoConfig  # resolved (pipeline.rl.config.resolve)
    batch: BatchPlan

    @cached_property
    def task(self) -> Task:
        return get_task(self.cfg.task)

    @cached_property
    def start(self) -> StartPoint:
        cfg = self.cfg
        return resolve_start(cfg.student, fmt=cfg.format, base_model=cfg.base_model, size_class=cfg.size_class)

    @cached_property
    def student(self) -> FinetuneConfig:
        """The student keys `train` and `grpo` share, as a FinetuneConfig, so the student is
        loaded, wrapped, checked and planned (pipeline.train.plan) by the same functions as an SFT
        student. Its batch keys are the rollouts' (padded: no micro-batch cap), so the plan's
        batch split is batch_plan's."""
        cfg, start = self.cfg, self.start
        return FinetuneConfig(student=start.model, tokenizer=cfg.tokenizer or start.tokenizer,
                              trust_remote_code=cfg.trust_remote_code, finetuning=cfg.finetuning, lora=cfg.lora,
                              precision=cfg.precision, attn_implementation=cfg.attn_implementation,
                              gradient_checkpointing=cfg.gradient_checkpointing, optim=cfg.optim, seed=cfg.seed,
                              deepspeed_on_cpu=cfg.deepspeed_on_cpu, global_batch_size=cfg.rollouts_per_step,
                              per_device_batch_size=cfg.per_device_batch_size,
                              max_per_device_batch_size=cfg.max_per_device_batch_size, batching="padded")

    @cached_property
    def questions(self) -> TrainingQuestions:
        """The task's training questions by prompt. TRL hands the rollout function prompts only,
        so the prompt names the question: a question whose text repeats an earlier one's is left out."""
        from pipeline.core.trajectory import question_line
        from pipeline.methods import prompt_prefixes

        cfg, task = self.cfg, self.task
        prefix = prompt_prefixes(cfg.format, cfg.prompting, task, cfg.wiki.search)[cfg.format].text
        by_prompt: dict = {}
        for q in task.load_questions(cfg.questions, limit=cfg.limit):
            by_prompt.setdefault(prefix + question_line(q.question, task.question_label), q)
        if len(by_prompt) < cfg.questions_per_step:
            raise PipelineError(f"questions: {cfg.questions} has {len(by_prompt)} distinct questions, fewer than "
                                f"questions_per_step={cfg.questions_per_step}; use more questions or fewer per step")
        rows = [{"prompt": p, "answer": q.answer, "question_id": str(q.id)} for p, q in by_prompt.items()]
        return TrainingQuestions(by_prompt, rows)


def plan_grpo(cfg: GrpoConfig, world_size: int) -> RlPlan:
    """The plan of a run of `world_size` processes; the batch split is checked at once (its
    refusal names the rollouts), the rest when first asked for."""
    return RlPlan(cfg, batch_plan(cfg, world_size))
