"""GRPO of a student in the WikiEnv with TRL's GRPOTrainer, under accelerate (`grpo` launches it).

    accelerate launch --config_file accelerate_configs/cpu.yaml -m pipeline.rl.train \\
        --config configs/grpo/smollm2-135m.yaml student=checkpoints/small/smollm2-135m/react/final
    python -m pipeline grpo --config ...          # picks the accelerate config and launches this

Each optimizer step: `questions_per_step` training questions, `group_size` rollouts of each
(pipeline.rl.rollout: the project's ReAct / Act loop, sampled from the current policy), the
reward of each from the task's metric (pipeline.rl.reward), TRL's group-relative advantages and
clipped policy-gradient loss over the policy's own tokens (observations masked by `env_mask`).
Checkpoints go to <output_dir>/checkpoint-N (a re-launch resumes the latest complete one, with
the same rollouts: their sampling is seeded by step); the policy, its manifest (the fields `eval`
reads, as `train` writes them) and its model card land in <output_dir>/final.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.config import to_dict
from pipeline.core.errors import PipelineError
from pipeline.core.storage import read_manifest
from pipeline.rl.config import GrpoConfig, resolve
from pipeline.rl.start import StartPoint, resolve_start
from pipeline.train.checkpoints import choose_resume, set_aside_incomplete
from pipeline.train.checks import Layout, layout_callback, saved_layout
from pipeline.train.config import FINAL_DIR, FinetuneConfig
from pipeline.train.data import load_tokenizer
from pipeline.train.deepspeed_setup import deepspeed_line, settle_deepspeed_config
from pipeline.train.final import check_same_precision, model_params_b, write_final
from pipeline.train.launch import Launch
from pipeline.train.model import load_student, peft_config
from pipeline.train.plan import TrainPlan, plan_training
from pipeline.train.run import check_launch
from pipeline.train.script import script_main
from pipeline.train.sft import split_batch
from pipeline.train.trainer import checkpointing_arguments, device_arguments


@dataclass
class BatchPlan:
    """rollouts per step = per_device x accumulation x processes (one generation per step)."""

    per_device: int
    grad_accum: int
    num_processes: int


def batch_plan(cfg: GrpoConfig, num_processes: int) -> BatchPlan:
    if cfg.rollouts_per_step % num_processes:
        raise PipelineError(f"{cfg.rollouts_per_step} rollouts per step (questions_per_step x group_size) do not divide "
                            f"over {num_processes} processes; make questions_per_step x group_size a multiple of "
                            f"{num_processes}")
    per_device, accum = split_batch(cfg.rollouts_per_step, num_processes, cfg.per_device_batch_size,
                                    cfg.max_per_device_batch_size, batch_name="questions_per_step x group_size")
    return BatchPlan(per_device, accum, num_processes)


def student_settings(cfg: GrpoConfig, start: StartPoint) -> FinetuneConfig:
    """The student keys `train` and `grpo` share, as a FinetuneConfig, so the student is
    loaded, wrapped, checked and planned (pipeline.train.plan) by the same functions as an SFT
    student. Its batch keys are the rollouts' (padded: no micro-batch cap), so the plan's batch
    split is batch_plan's."""
    return FinetuneConfig(student=start.model, tokenizer=cfg.tokenizer or start.tokenizer,
                          trust_remote_code=cfg.trust_remote_code, finetuning=cfg.finetuning, lora=cfg.lora,
                          precision=cfg.precision, attn_implementation=cfg.attn_implementation,
                          gradient_checkpointing=cfg.gradient_checkpointing, optim=cfg.optim, seed=cfg.seed,
                          deepspeed_on_cpu=cfg.deepspeed_on_cpu, global_batch_size=cfg.rollouts_per_step,
                          per_device_batch_size=cfg.per_device_batch_size,
                          max_per_device_batch_size=cfg.max_per_device_batch_size, batching="padded")


def load_policy(ft: FinetuneConfig, train_plan: TrainPlan, start: StartPoint, tokenizer):
    """(model, peft_config for TRL or None): a LoRA start's adapter is trained on (finetuning:
    lora) or merged into its base (full); a full start gets a new adapter under lora."""
    model = load_student(ft, tokenizer, train_plan)
    if start.adapter is None:
        return model, peft_config(ft)
    from peft import PeftModel

    model = PeftModel.from_pretrained(model, start.adapter, is_trainable=ft.finetuning == "lora")
    return (model, None) if ft.finetuning == "lora" else (model.merge_and_unload(), None)


def training_questions(cfg: GrpoConfig) -> tuple[dict, list[dict]]:
    """({prompt: question}, dataset rows). TRL hands the rollout function prompts only, so the
    prompt names the question: a question whose text repeats an earlier one's is left out."""
    from pipeline.core.trajectory import question_line
    from pipeline.methods import prompt_prefixes
    from pipeline.tasks.hotpotqa.questions import load_question_set

    prefix = prompt_prefixes(cfg.format, cfg.prompting)[cfg.format].text
    by_prompt: dict = {}
    for q in load_question_set(cfg.questions, limit=cfg.limit):
        by_prompt.setdefault(prefix + question_line(q.question), q)
    if len(by_prompt) < cfg.questions_per_step:
        raise PipelineError(f"questions: {cfg.questions} has {len(by_prompt)} distinct questions, fewer than "
                            f"questions_per_step={cfg.questions_per_step}; use more questions or fewer per step")
    rows = [{"prompt": p, "answer": q.answer, "question_id": str(q.id)} for p, q in by_prompt.items()]
    return by_prompt, rows


def grpo_arguments(cfg: GrpoConfig, plan: BatchPlan, train_plan: TrainPlan):
    from trl import GRPOConfig

    vllm = {}
    if cfg.rollout.engine == "vllm":
        r = cfg.rollout
        vllm = dict(use_vllm=True, vllm_mode=r.vllm_mode, vllm_server_base_url=r.vllm_server_base_url,
                    vllm_gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                    vllm_tensor_parallel_size=r.vllm_tensor_parallel_size, **r.vllm_extra)
    return GRPOConfig(
        output_dir=str(cfg.output_dir), max_steps=cfg.max_steps,
        per_device_train_batch_size=plan.per_device, gradient_accumulation_steps=plan.grad_accum,
        num_generations=cfg.group_size,  # steps_per_generation defaults to grad_accum: one rollout batch per step
        learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=math.ceil(cfg.warmup_ratio * cfg.max_steps), weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, optim=cfg.optim, bf16=train_plan.bf16, fp16=cfg.precision == "fp16",
        beta=cfg.beta, epsilon=cfg.epsilon, loss_type=cfg.loss_type, scale_rewards=cfg.scale_rewards,
        num_iterations=cfg.num_iterations,
        # The loss divides the logits by it: the log-probabilities are those of the sampling distribution.
        temperature=cfg.prompting.temperature,
        max_completion_length=cfg.prompting.max_steps * cfg.prompting.max_new_tokens,  # dr_grpo's constant
        reward_weights=[cfg.reward.em, cfg.reward.f1, cfg.reward.format],
        shuffle_dataset=True, save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps, logging_first_step=True,
        report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        seed=cfg.seed, data_seed=cfg.seed, remove_unused_columns=False, disable_tqdm=False,
        **device_arguments(train_plan),
        **checkpointing_arguments(GRPOConfig, train_plan.fsdp),
        **vllm,
    )


def grpo_trainer_class():
    """TRL's GRPOTrainer whose log() adds the throughput figures (tokens/s, TFLOP/s, MFU)."""
    from trl import GRPOTrainer

    class PipelineGRPOTrainer(GRPOTrainer):
        throughput = None  # a pipeline.rl.throughput.RolloutThroughput

        def log(self, logs, *args, **kwargs):
            if self.throughput is not None and "loss" in logs:
                logs.update(self.throughput.metrics())
            super().log(logs, *args, **kwargs)

    return PipelineGRPOTrainer


def build_trainer(cfg: GrpoConfig, start: StartPoint, plan: BatchPlan, layout: Layout, by_prompt: dict,
                  rows: list[dict], train_plan: TrainPlan | None = None):
    """The GRPO trainer of this run; `train_plan` (default: this process's) is the student's plan."""
    import torch
    from accelerate import PartialState
    from datasets import Dataset

    from pipeline.methods import build_method
    from pipeline.rl.reward import reward_functions
    from pipeline.rl.rollout import Rollouts
    from pipeline.rl.throughput import RolloutThroughput
    from pipeline.wiki.config import open_backend

    ft = student_settings(cfg, start)
    train_plan = plan_training(ft) if train_plan is None else train_plan
    tokenizer = load_tokenizer(ft)
    model, peft = load_policy(ft, train_plan, start, tokenizer)
    with PartialState().main_process_first():  # the first process builds a missing index, the others read it
        backend = open_backend(cfg.wiki)
    rollouts = Rollouts(by_prompt, build_method(cfg.format, cfg.prompting), backend, seed=cfg.seed,
                        max_batch_size=cfg.rollout.max_batch_size, max_context=cfg.rollout.max_context,
                        engine=cfg.rollout.engine,
                        log_dir=cfg.output_dir / "rollouts" if cfg.log_rollouts else None)
    trainer = grpo_trainer_class()(model=model, reward_funcs=reward_functions(),
                                   args=grpo_arguments(cfg, plan, train_plan),
                                   train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                                   peft_config=peft, rollout_func=rollouts, callbacks=[layout_callback(layout)])
    from pipeline.train.flops import peak_tflops

    peak = cfg.peak_tflops or (peak_tflops(torch.cuda.get_device_name()) if train_plan.cuda else None)
    trainer.throughput = RolloutThroughput(model.config, full_finetuning=cfg.finetuning == "full",
                                           checkpointing=cfg.gradient_checkpointing,
                                           extra_forwards=int(cfg.beta != 0) + int(cfg.num_iterations > 1), peak=peak)
    trainer.add_callback(trainer.throughput.callback())
    rollouts.on_counts = trainer.throughput.add
    return trainer, tokenizer


def check_resume(resume: Path | None, layout: Layout) -> str:
    """A GRPO step's rollouts are spread over the processes by the sampler: resume on the layout
    that wrote the checkpoint, or not at all."""
    if resume is None:
        return "starting from step 0"
    saved = saved_layout(resume)
    if saved is not None and saved != layout:
        raise PipelineError(f"resume: {resume} was written with rollouts {saved.describe()} on {saved.examples} "
                            f"questions; this launch has {layout.describe()} on {layout.examples}: relaunch with "
                            f"--num_processes {saved.num_processes} and the same batch keys, or resume=none to start over")
    return f"resuming from {resume}"


def run(cfg: GrpoConfig) -> dict:
    """Train (or resume) and save the final policy; returns the final manifest."""
    cfg = resolve(cfg)
    deepspeed = settle_deepspeed_config()  # before anything reads the launch's strategy (SFT's run does the same)
    start = resolve_start(cfg.student, fmt=cfg.format, base_model=cfg.base_model, size_class=cfg.size_class)
    ft = student_settings(cfg, start)
    final = cfg.output_dir / FINAL_DIR
    done = read_manifest(final / "manifest.json") if final.is_dir() else None
    launch = Launch.from_env()
    plan = batch_plan(cfg, launch.world_size)  # before the plan: its refusal names the rollouts
    train_plan = plan_training(ft, launch, deepspeed=deepspeed)
    check_same_precision(done, train_plan.precision.precision, final)
    if done and done.get("complete") and done.get("steps") == cfg.max_steps:
        print(f"[grpo] {final} is already complete ({cfg.max_steps} steps); nothing to do")
        return done
    check_launch(ft, train_plan)
    by_prompt, rows = training_questions(cfg)
    layout = Layout(plan.num_processes, plan.per_device, plan.grad_accum, cfg.rollouts_per_step, launch.strategy,
                    len(rows))
    rank0 = launch.rank0
    if rank0:
        print(train_plan.precision.line("training"))
        if deepspeed:
            print(deepspeed_line(*deepspeed).replace("[finetune]", "[grpo]"))
        print(f"[grpo] {cfg.format} from {start.kind} {cfg.student}: {cfg.questions_per_step} questions x "
              f"{cfg.group_size} rollouts = {cfg.rollouts_per_step} per step = {plan.per_device} per device x "
              f"{plan.grad_accum} accumulation x {plan.num_processes} processes; {cfg.max_steps} steps; "
              f"output {cfg.output_dir}")
    trainer, tokenizer = build_trainer(cfg, start, plan, layout, by_prompt, rows, train_plan)
    if rank0:
        for path, why in set_aside_incomplete(cfg.output_dir):
            print(f"[grpo] set aside an incomplete checkpoint: {path} ({why})")
    trainer.accelerator.wait_for_everyone()
    resume = choose_resume(cfg)
    line = check_resume(resume, layout)  # every rank reads the same files: every rank refuses alike
    if rank0:
        print(f"[grpo] {line}")
    started = time.time()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return save_policy(trainer, cfg, start, tokenizer, plan, train_plan, len(rows), result, started)


def save_policy(trainer, cfg: GrpoConfig, start: StartPoint, tokenizer, plan: BatchPlan, train_plan: TrainPlan,
                n_questions: int, result, started: float) -> dict:
    from pipeline.hub.models import size_label
    from pipeline.rl.card import grpo_card
    from pipeline.rl.curve import reward_curve, write_curve

    params_b = model_params_b(trainer)
    curve = reward_curve(trainer.state.log_history)
    if trainer.accelerator.is_main_process:
        write_curve(curve, cfg.output_dir)
    fields = dict(
        student=cfg.student_name, base_model=start.model, init="pretrained",
        adapter=cfg.finetuning == "lora", finetuning=cfg.finetuning, format=cfg.format,
        size_class=cfg.size_class or start.size_class or size_label(params_b),
        steps=trainer.state.global_step, max_steps=cfg.max_steps, tokenizer=".",
        tokenizer_source=cfg.tokenizer or start.tokenizer, eos_token=tokenizer.eos_token,
        prompt_format="Question: {question}\n",
        mask_observations=True,  # the environment's tokens are never in the GRPO loss
        params_b=params_b, global_batch_size=cfg.rollouts_per_step, per_device_batch_size=plan.per_device,
        gradient_accumulation_steps=plan.grad_accum, num_processes=plan.num_processes,
        dataset={"questions": cfg.questions, "limit": cfg.limit, "distinct_questions": n_questions},
        train_loss=getattr(result, "training_loss", None), seconds=round(time.time() - started, 1),
        precision=train_plan.precision.precision,
        start={"checkpoint": cfg.student, "kind": start.kind, "trained_format": start.trained_format,
               "model": start.model, "adapter": start.adapter},
        grpo={"group_size": cfg.group_size, "questions_per_step": cfg.questions_per_step,
              "reward_weights": to_dict(cfg.reward), "beta": cfg.beta, "loss_type": cfg.loss_type,
              "temperature": cfg.prompting.temperature, "max_steps_per_episode": cfg.prompting.max_steps,
              "reward_first_steps": curve.mean_reward(first=True), "reward_last_steps": curve.mean_reward(first=False)},
    )
    return write_final(trainer, cfg, train_plan, tokenizer, "grpo", fields, lambda manifest: grpo_card(manifest, []),
                       label="grpo")


def main(argv: list[str] | None = None) -> int:
    return script_main(argv, GrpoConfig, section="grpo", resolve=resolve, run=run, prog="python -m pipeline.rl.train",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
