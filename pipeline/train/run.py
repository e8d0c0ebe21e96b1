"""Train (or resume) a student on one format's SFT dataset and save final/: the body of the script
`accelerate launch` runs (pipeline/finetune.py), in the order it runs. The run is resolved once
into a plan (pipeline.train.plan) that rank 0 prints; every step after it takes the plan.
"""

from __future__ import annotations

import importlib.util
import time

from pipeline.core.errors import PipelineError
from pipeline.core.storage import is_done, read_manifest
from pipeline.train.checkpoints import choose_resume, set_aside_incomplete
from pipeline.train.checks import (
    Layout,
    check_config,
    check_devices,
    check_resume_layout,
    layout_callback,
    saved_layout,
)
from pipeline.train.config import FINAL_DIR, FinetuneConfig, resolve
from pipeline.train.data import load_sft_records, load_tokenizer
from pipeline.train.deepspeed_setup import check_deepspeed_device, settle_deepspeed_config
from pipeline.train.final import check_same_precision, save_final
from pipeline.train.notices import drop_padding_free_note
from pipeline.train.plan import TrainPlan, plan_training
from pipeline.train.trainer import build_trainer


def check_launch(cfg: FinetuneConfig, plan: TrainPlan) -> None:
    """Config-time checks (pipeline/train/checks.py): this config, this launch, this node."""
    check_devices(plan.launch)
    check_deepspeed_device(plan.launch.deepspeed, plan.cuda, cfg.deepspeed_on_cpu, plan.launch.world_size)
    check_config(cfg.finetuning, cfg.optim, plan.launch.strategy, plan.cuda,
                 importlib.util.find_spec("bitsandbytes") is not None)


def run(cfg: FinetuneConfig) -> dict:
    """Train (or resume) and save the final model; returns the final manifest."""
    from pipeline.train.sft import tokenize_records

    cfg = resolve(cfg)
    deepspeed = settle_deepspeed_config()  # before the launch's strategy is read
    plan = plan_training(cfg, deepspeed=deepspeed)
    final = cfg.output_dir / FINAL_DIR
    done = read_manifest(final / "manifest.json") if final.is_dir() else None
    check_same_precision(done, plan.precision.precision, final)
    if is_done(final / "manifest.json", steps=cfg.max_steps):
        print(f"[finetune] {final} is already complete ({cfg.max_steps} steps); nothing to do")
        return done
    check_launch(cfg, plan)
    dataset_path, records = load_sft_records(cfg)
    tokenizer = load_tokenizer(cfg)
    examples, report = tokenize_records(records, tokenizer, mask_observations=cfg.mask_observations,
                                        max_length=cfg.max_length, long_examples=cfg.long_examples)
    if not examples:
        raise PipelineError(f"{dataset_path}: every example is longer than max_length={cfg.max_length}")
    rank0 = plan.launch.rank0
    if plan.batch.capped:  # the plan says why a micro-batch holds one trajectory: TRL's note would repeat it
        drop_padding_free_note()
    if rank0:
        print("\n".join(plan.lines(cfg)))
        print(f"[finetune] {cfg.format} on {cfg.student_name}: {report.summary()}")
    layout = Layout(plan.launch.world_size, plan.batch.per_device, plan.batch.grad_accum, cfg.global_batch_size,
                    plan.launch.strategy, len(examples))
    trainer = build_trainer(cfg, plan, examples, tokenizer, report.max_length, callbacks=[layout_callback(layout)])
    if rank0:
        for path, why in set_aside_incomplete(cfg.output_dir):
            print(f"[finetune] set aside an incomplete checkpoint: {path} ({why})")
    trainer.accelerator.wait_for_everyone()
    resume = choose_resume(cfg)
    # every rank reads the same files, so every rank refuses alike (no rank left waiting)
    line = check_resume_layout(resume, saved_layout(resume), layout) if resume else "starting from step 0"
    if rank0:
        print(f"[finetune] {line}")
    started = time.time()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return save_final(trainer, cfg, plan, tokenizer, dataset_path, report, result, started)
