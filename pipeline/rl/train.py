"""GRPO of a student in the WikiEnv with TRL's GRPOTrainer, under accelerate (`grpo` launches it).

    accelerate launch --config_file accelerate_configs/cpu.yaml -m pipeline.rl.train \\
        --config configs/grpo/smollm2-135m.yaml student=checkpoints/small/smollm2-135m/react/final
    python -m pipeline grpo --config ...          # picks the accelerate config and launches this

The run is resolved once into a plan (pipeline.rl.plan: task, batch split, start point, training
questions), handed to the trainer's builder and to the final save. Each optimizer step:
`questions_per_step` training questions, `group_size` rollouts of each
(pipeline.rl.rollout: the project's ReAct / Act loop, sampled from the current policy), the
reward of each from the task's metric (`task:`, pipeline.rl.reward), TRL's group-relative advantages and
clipped policy-gradient loss over the policy's own tokens (observations masked by `env_mask`).
Checkpoints go to <output_dir>/checkpoint-N (a re-launch resumes the latest complete one, with
the same rollouts: their sampling is seeded by step); the policy, its manifest (the fields `eval`
reads, as `train` writes them) and its model card land in <output_dir>/final.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from pipeline.core.config import to_dict
from pipeline.core.errors import PipelineError
from pipeline.core.storage import read_manifest
from pipeline.rl.config import GrpoConfig, check_rollout_strategy, check_vllm_installed, resolve
from pipeline.rl.plan import BatchPlan, RlPlan, plan_grpo
from pipeline.rl.start import StartPoint
from pipeline.train.checkpoints import choose_resume, set_aside_incomplete
from pipeline.train.checks import Layout, layout_callback, saved_layout
from pipeline.train.config import FINAL_DIR, FinetuneConfig
from pipeline.train.data import load_tokenizer
from pipeline.train.deepspeed_setup import deepspeed_line, settle_deepspeed_config
from pipeline.train.final import check_same_precision, model_params_b, write_final
from pipeline.train.launch import Launch
from pipeline.train.model import load_student, peft_config
from pipeline.train.notices import EXPERIMENTAL_TRL_LINE
from pipeline.train.plan import TrainPlan, plan_training
from pipeline.train.run import check_launch
from pipeline.train.script import script_main
from pipeline.train.trainer import checkpointing_arguments, device_arguments


def load_policy(ft: FinetuneConfig, train_plan: TrainPlan, start: StartPoint, tokenizer):
    """(model, peft_config for TRL or None): a LoRA start's adapter is trained on (finetuning:
    lora) or merged into its base (full); a full start gets a new adapter under lora."""
    model = load_student(ft, tokenizer, train_plan)
    if start.adapter is None:
        return model, peft_config(ft)
    from peft import PeftModel

    model = PeftModel.from_pretrained(model, start.adapter, is_trainable=ft.finetuning == "lora")
    return (model, None) if ft.finetuning == "lora" else (model.merge_and_unload(), None)


def grpo_arguments(cfg: GrpoConfig, plan: BatchPlan, train_plan: TrainPlan):
    from trl import GRPOConfig

    vllm = {}
    if cfg.rollout.engine == "vllm":
        r = cfg.rollout
        vllm = dict(use_vllm=True, vllm_mode=r.vllm_mode, vllm_server_base_url=r.vllm_server_base_url,
                    vllm_gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                    vllm_tensor_parallel_size=r.vllm_tensor_parallel_size, vllm_max_model_length=r.max_context)
        vllm.update(r.vllm_extra)
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
    """TRL's GRPOTrainer whose log() adds the throughput figures (tokens/s, TFLOP/s, MFU) and
    whose micro-batches of a step are regrouped by length and trimmed (pipeline.rl.microbatch)."""
    from trl import GRPOTrainer

    from pipeline.rl import microbatch

    class PipelineGRPOTrainer(GRPOTrainer):
        throughput = None  # a pipeline.rl.throughput.RolloutThroughput
        trim_micro_batches = True  # False: TRL's micro-batches as it pads them (bench/bench_grpo_step.py's baseline)

        def _prepare_inputs(self, generation_batch):
            """TRL's, then (on a step that generated: TRL buffered a new list) its micro-batches
            regrouped and trimmed."""
            before = self._buffered_inputs
            inputs = super()._prepare_inputs(generation_batch)
            if self._buffered_inputs is before or not self.trim_micro_batches:
                return inputs
            self._buffered_inputs = microbatch.regroup(self._buffered_inputs, microbatch.pairing_keeps_the_loss(self))
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

        def log(self, logs, *args, **kwargs):
            if self.throughput is not None and "loss" in logs:
                logs.update(self.throughput.metrics())
            super().log(logs, *args, **kwargs)

    return PipelineGRPOTrainer


def build_trainer(plan: RlPlan, layout: Layout, train_plan: TrainPlan | None = None):
    """The GRPO trainer of this run; `train_plan` (default: this process's) is the student's plan."""
    import torch
    from datasets import Dataset

    from pipeline.methods import build_method
    from pipeline.rl.reward import reward_functions
    from pipeline.rl.rollout import Rollouts
    from pipeline.rl.throughput import RolloutThroughput

    cfg, ft = plan.cfg, plan.student
    train_plan = plan_training(ft) if train_plan is None else train_plan
    tokenizer = load_tokenizer(ft)
    # The arguments first: under DeepSpeed ZeRO-3 they register the DeepSpeed config that makes
    # from_pretrained partition the policy as it loads (zero.Init) instead of each rank holding all of it
    # (TrainingArguments' __post_init__; the SFT trainer builds them first too). Kept alive: transformers
    # holds that config by a weak reference.
    args = grpo_arguments(cfg, plan.batch, train_plan)
    model, peft = load_policy(ft, train_plan, plan.start, tokenizer)
    if train_plan.launch.strategy == "zero3" and train_plan.launch.rank0:
        print(f"[grpo] ZeRO-3: {partition_line(model)}")
    backend = open_environment(cfg)
    rollouts = Rollouts(plan.questions.by_prompt, build_method(cfg.format, cfg.prompting, plan.task, cfg.wiki.search), backend,
                        seed=cfg.seed,
                        max_batch_size=cfg.rollout.max_batch_size, max_context=cfg.rollout.max_context,
                        engine=cfg.rollout.engine, sample_dtype=sample_dtype(cfg, train_plan),
                        log_dir=cfg.output_dir / "rollouts" if cfg.log_rollouts else None)
    trainer = grpo_trainer_class()(model=model, reward_funcs=reward_functions(plan.task),
                                   args=args,
                                   train_dataset=Dataset.from_list(plan.questions.rows), processing_class=tokenizer,
                                   peft_config=peft, rollout_func=rollouts, callbacks=[layout_callback(layout)])
    from pipeline.train.flops import peak_tflops

    peak = cfg.peak_tflops or (peak_tflops(torch.cuda.get_device_name()) if train_plan.cuda else None)
    trainer.throughput = RolloutThroughput(model.config, full_finetuning=cfg.finetuning == "full",
                                           checkpointing=cfg.gradient_checkpointing,
                                           extra_forwards=extra_forwards(cfg), peak=peak)
    trainer.add_callback(trainer.throughput.callback())
    rollouts.on_counts = trainer.throughput.add
    if cfg.heldout.every:
        trainer.add_callback(heldout_callback(trainer, plan, backend, train_plan))
    return trainer, tokenizer


def heldout_callback(trainer, plan: RlPlan, backend, train_plan: TrainPlan):
    """The held-out curve's callback (pipeline.rl.heldout): the task's questions, the loop greedy."""
    from dataclasses import replace

    from pipeline.methods import build_method
    from pipeline.rl import heldout

    cfg = plan.cfg
    questions = plan.task.load_questions(cfg.heldout.questions, limit=cfg.heldout.limit)
    method = build_method(cfg.format, replace(cfg.prompting, temperature=0.0), plan.task, cfg.wiki.search)
    return heldout.heldout_callback(trainer, cfg.heldout, questions, method, backend, cfg.rollout.max_batch_size,
                                    cfg.output_dir, sample_dtype(cfg, train_plan))


def sample_dtype(cfg: GrpoConfig, train_plan: TrainPlan) -> str:
    """What the transformers engine samples from: bf16 weights under bf16 mixed precision
    (rollout.precision auto), else the fp32 master weights (pipeline.rl.policy.sampling_weights)."""
    return "bf16" if cfg.rollout.precision == "auto" and train_plan.bf16 else "fp32"


def extra_forwards(cfg: GrpoConfig) -> int:
    """No-grad forwards over each rollout besides the update's (for MFU): the reference model's
    (beta > 0), and the old log-probabilities', which TRL computes when a batch is optimised more
    than once or vLLM sampled it (its importance-sampling correction, on by default)."""
    return int(cfg.beta != 0) + int(cfg.num_iterations > 1 or cfg.rollout.engine == "vllm")


def partition_line(model) -> str:
    """Whether the policy came out of from_pretrained partitioned (DeepSpeed tags each parameter
    zero.Init partitions with a ds_id), and what this rank holds of it."""
    params = list(model.parameters())
    if not any(hasattr(p, "ds_id") for p in params):
        return "the policy was loaded whole on every rank (not partitioned at load)"
    held = sum(p.numel() for p in params)  # a partitioned parameter's local tensor is empty
    total = sum(getattr(p, "ds_numel", p.numel()) for p in params)
    return f"the policy was partitioned as it loaded (zero.Init): this rank holds {held:,} of {total:,} parameters"


def open_environment(cfg: GrpoConfig):
    """The Wikipedia backend, a missing local index built once per machine. The global first
    process builds it first (on a shared filesystem, the only build); then each machine's first
    process builds it where its own disk still lacks it (node-local storage), its other processes
    waiting. (`main_process_first` alone would release every other machine's processes together,
    each building its own copy at once.) Builds are atomic (a temporary file renamed into place)."""
    from accelerate import PartialState

    from pipeline.wiki.config import open_backend

    state, backend = PartialState(), None
    with state.main_process_first():
        if state.is_main_process:
            backend = open_backend(cfg.wiki)
    with state.local_main_process_first():
        if not state.is_main_process:
            backend = open_backend(cfg.wiki)
    return backend


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
    launch = Launch.from_env()
    plan = plan_grpo(cfg, launch.world_size)  # the batch split first: its refusal names the rollouts
    final = cfg.output_dir / FINAL_DIR
    done = read_manifest(final / "manifest.json") if final.is_dir() else None
    train_plan = plan_training(plan.student, launch, deepspeed=deepspeed)
    check_same_precision(done, train_plan.precision.precision, final)
    if done and done.get("complete") and done.get("steps") == cfg.max_steps:
        print(f"[grpo] {final} is already complete ({cfg.max_steps} steps); nothing to do")
        return done
    check_launch(plan.student, train_plan)
    check_rollout_strategy(cfg.rollout.engine, launch.strategy)
    check_vllm_installed(cfg.rollout.engine)  # before the policy loads
    batch, rows = plan.batch, plan.questions.rows
    layout = Layout(batch.num_processes, batch.per_device, batch.grad_accum, cfg.rollouts_per_step, launch.strategy,
                    len(rows))
    rank0 = launch.rank0
    if rank0:
        print(train_plan.precision.line("training"))
        print(EXPERIMENTAL_TRL_LINE)  # in place of TRL's own notice, silenced on every rank (pipeline.train.notices)
        if deepspeed:
            print(deepspeed_line(*deepspeed).replace("[finetune]", "[grpo]"))
        print(f"[grpo] {cfg.format} on {plan.task.title} from {plan.start.kind} {cfg.student}: {cfg.questions_per_step} "
              f"questions x {cfg.group_size} rollouts = {cfg.rollouts_per_step} per step = {batch.per_device} per "
              f"device x {batch.grad_accum} accumulation x {batch.num_processes} processes; {cfg.max_steps} steps; "
              f"output {cfg.output_dir}")
    trainer, tokenizer = build_trainer(plan, layout, train_plan)
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
    return save_policy(trainer, plan, tokenizer, train_plan, result, started)


def save_policy(trainer, plan: RlPlan, tokenizer, train_plan: TrainPlan, result, started: float) -> dict:
    from pipeline.hub.cards import model_card
    from pipeline.hub.models import size_label
    from pipeline.rl.curve import reward_curve, write_curve

    cfg, start, task, batch = plan.cfg, plan.start, plan.task, plan.batch
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
        task=task.name, prompt_format=f"{task.question_label}: {{question}}\n",
        mask_observations=True,  # the environment's tokens are never in the GRPO loss
        params_b=params_b, global_batch_size=cfg.rollouts_per_step, per_device_batch_size=batch.per_device,
        gradient_accumulation_steps=batch.grad_accum, num_processes=batch.num_processes,
        dataset={"questions": cfg.questions, "limit": cfg.limit, "distinct_questions": len(plan.questions.rows)},
        train_loss=getattr(result, "training_loss", None), seconds=round(time.time() - started, 1),
        precision=train_plan.precision.precision,
        origin_model=start.origin,  # the lineage's pretrained root: its licence binds this policy (hub/cards.py)
        start={"checkpoint": cfg.student, "kind": start.kind, "trained_format": start.trained_format,
               "model": start.model, "adapter": start.adapter},
        grpo={"group_size": cfg.group_size, "questions_per_step": cfg.questions_per_step,
              "reward_weights": to_dict(cfg.reward), "beta": cfg.beta, "loss_type": cfg.loss_type,
              "temperature": cfg.prompting.temperature, "max_steps_per_episode": cfg.prompting.max_steps,
              "reward_first_steps": curve.mean_reward(first=True), "reward_last_steps": curve.mean_reward(first=False)},
    )
    return write_final(trainer, cfg, train_plan, tokenizer, "grpo", fields, lambda manifest: model_card(manifest, []),
                       label="grpo")


def main(argv: list[str] | None = None) -> int:
    return script_main(argv, GrpoConfig, section="grpo", resolve=resolve, run=run, prog="python -m pipeline.rl.train",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
