"""What a finished run leaves: <output_dir>/final with the model (or LoRA adapter), its tokenizer,
manifest and model card, written to final.partial and renamed, so a reader never sees half of it;
and the refusal to count a final/ trained in another precision as this run's.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.core.config import to_dict
from pipeline.core.errors import PipelineError
from pipeline.core.storage import file_fingerprint, write_manifest
from pipeline.hub.models import origin_model, resolve_model_path
from pipeline.train.checkpoints import remove_checkpoints
from pipeline.train.config import FINAL_DIR, FinetuneConfig
from pipeline.train.data import dataset_search, dataset_task
from pipeline.train.deepspeed_setup import deepspeed_record
from pipeline.train.plan import TrainPlan


def check_same_precision(done: dict | None, precision: str, final: Path) -> None:
    """A finished model trained in another precision is not this run's result: say so, never skip."""
    was = (done or {}).get("precision")  # manifests older than the field: unknown, not checked
    if done and done.get("complete") and was and was != precision:
        raise PipelineError(f"{final} was trained in {was}, this run would train in {precision}; set "
                            f"precision={was}, or use another experiment / output_dir (or delete that "
                            "folder) to train afresh")


def save_final(trainer, cfg: FinetuneConfig, plan: TrainPlan, tokenizer, dataset_path: Path, report, result,
               started: float) -> dict:
    """The trained model (or adapter) in <output_dir>/final, with its manifest and model card."""
    from pipeline.hub.cards import model_card

    task = dataset_task(dataset_path)
    fields = dict(
        student=cfg.student_name, **lineage(cfg), search=dataset_search(dataset_path),
        init=cfg.init, adapter=cfg.finetuning != "full", finetuning=cfg.finetuning, format=cfg.format,
        layout=cfg.layout,  # messages: decodes chat turns with tool calls (prompting.interface: tools)
        size_class=cfg.size_class, steps=trainer.state.global_step, max_steps=cfg.max_steps,
        tokenizer=".", tokenizer_source=cfg.tokenizer or cfg.student, eos_token=tokenizer.eos_token,
        task=task.name, prompt_format=f"{task.question_label}: {{question}}\n", mask_observations=cfg.mask_observations,
        params_b=model_params_b(trainer),
        global_batch_size=cfg.global_batch_size, per_device_batch_size=plan.batch.per_device,
        gradient_accumulation_steps=plan.batch.grad_accum, num_processes=plan.launch.world_size,
        dataset={**file_fingerprint(dataset_path), "examples": report.n_kept}, lengths=report.to_dict(),
        train_loss=getattr(result, "training_loss", None), seconds=round(time.time() - started, 1),
        precision=plan.precision.precision, weights=plan.weights.precision,
        deepspeed=deepspeed_record(trainer),
    )
    return write_final(trainer, cfg, plan, tokenizer, "train", fields, lambda manifest: model_card(manifest, []),
                       label="finetune")


def lineage(cfg: FinetuneConfig) -> dict:
    """What the model was trained from: `base_model`, the weights it started from (a later round's
    start is round k-1's final/), and `origin_model`, the pretrained root of that lineage, whose
    licence binds this model too (its card names it). A random init has neither."""
    if cfg.init == "random":
        return {"base_model": None, "origin_model": None}
    return {"base_model": resolve_model_path(cfg.student), "origin_model": origin_model(cfg.student)}


def model_params_b(trainer) -> float:
    return sum(getattr(p, "ds_numel", p.numel()) for p in trainer.model.parameters()) / 1e9  # ZeRO-3 shards: ds_numel


def write_final(trainer, cfg, plan: TrainPlan, tokenizer, stage: str, fields: dict, card, label: str) -> dict:
    """Save model (or adapter) + tokenizer to <output_dir>/final.partial with the manifest
    (`stage`, the config, `fields`) and the model card (`card(manifest)`), then rename it to
    final. Every rank joins (ZeRO-3 gathers the shards); rank 0 writes and prints as `[label]`.
    `cfg` is the run's config (`train`'s or `grpo`'s: output_dir, keep_checkpoints); `plan` its
    training plan (FSDP's final gather, the training dtype)."""
    import shutil
    final = cfg.output_dir / FINAL_DIR
    partial = cfg.output_dir / f"{FINAL_DIR}.partial"
    rank0 = trainer.accelerator.is_main_process
    if rank0 and partial.exists():
        shutil.rmtree(partial)
    trainer.accelerator.wait_for_everyone()
    if plan.fsdp.final_gather:
        save_fsdp_final(trainer, partial, plan.bf16)
    else:
        trainer.save_model(str(partial))  # every rank joins (ZeRO-3 gathers the shards)
    manifest: dict = {}
    if rank0:
        tokenizer.save_pretrained(str(partial))
        manifest = write_manifest(partial / "manifest.json", stage=stage, config=to_dict(cfg), complete=True,
                                  **fields)
        # The model card every checkpoint carries (replacing PEFT's template); `run` adds eval results.
        (partial / "README.md").write_text(card(manifest), encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        print(f"[{label}] saved {'adapter' if fields.get('adapter') else 'model'} to {final}")
        if not cfg.keep_checkpoints:
            freed = remove_checkpoints(cfg.output_dir)
            print(f"[{label}] keep_checkpoints: false: removed {len(freed)} checkpoint folder(s), "
                  f"{sum(size for _, size in freed) / 1e9:.1f} GB (final/ is complete)")
    trainer.accelerator.wait_for_everyone()
    return manifest


def save_fsdp_final(trainer, folder: Path, bf16: bool) -> None:
    """final/ under FSDP: a plain HF folder in the training dtype, whatever the checkpoints'
    state-dict type. Trainer.save_model writes no HF weights for SHARDED_STATE_DICT and saves the
    fp32 master weights for FULL_STATE_DICT; here every rank joins one full gather (offloaded to
    CPU, kept on rank 0), and rank 0 saves it in bf16 (the adapter alone for LoRA)."""
    import torch
    state_dict = trainer.accelerator.get_state_dict(trainer.model)  # collective: every rank
    if trainer.accelerator.is_main_process:
        dtype = torch.bfloat16 if bf16 else None
        if dtype is not None:
            state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
        model = trainer.accelerator.unwrap_model(trainer.model)
        model.save_pretrained(str(folder), state_dict=state_dict, safe_serialization=True)
    trainer.accelerator.wait_for_everyone()
