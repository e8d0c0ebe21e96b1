"""Fine-tune a student on one trajectory format's SFT dataset with TRL's SFTTrainer (+ PEFT), under accelerate.

    # one CPU process (the demo); `pipeline/finetune.py` in place of `-m pipeline.finetune` works too
    accelerate launch --config_file accelerate_configs/cpu.yaml -m pipeline.finetune \\
        --config configs/students/smollm2-135m.yaml format=react dataset_dir=data/sft
    # 2 CPU processes (DDP over gloo)
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml -m pipeline.finetune --config ...
    # 8 GPUs, DeepSpeed ZeRO-3
    accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml -m pipeline.finetune \\
        --config configs/students/llama-3.1-8b.yaml format=react
    # or let the `train` stage pick the accelerate config:  python -m pipeline train --config ...

The global batch (64, the paper's) is split as per_device x grad_accum x processes at launch.
Steps default to the paper's table by format and size class. Checkpoints go to
checkpoints/<experiment>/<student>/<format>/checkpoint-N; a re-launch resumes the latest
COMPLETE one; the trained model (or LoRA adapter) + tokenizer + manifest.json land in .../final.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pipeline.config import add_config_arguments, stage_config, to_dict
from pipeline.errors import PipelineError
from pipeline.llm import models
from pipeline.llm.models import model_label, resolve_model_path
from pipeline.storage import (
    file_fingerprint,
    is_done,
    read_jsonl,
    read_manifest,
    require_complete,
    write_manifest,
)
from pipeline.trajectory import FORMATS

# Paper (appendix B.1): batch 64; steps by size class and trajectory format.
PAPER_STEPS = {
    "8b": {"react": 4000, "act": 4000, "standard": 2000, "cot": 2000},
    "62b": {"react": 4000, "act": 4000, "standard": 1000, "cot": 1000},
}
# Open-model size classes map onto the paper's two (7B/8B -> 8b; 70B/72B -> 62b); smaller
# demo students use the 8b schedule.
SIZE_CLASS_SCHEDULE = {"8b": "8b", "7b": "8b", "135m": "8b", "tiny": "8b", "62b": "62b", "70b": "62b", "72b": "62b"}

FINAL_DIR = "final"
CHECKPOINT_PREFIX = "checkpoint-"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")


@dataclass
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"])


@dataclass
class FinetuneConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"method": "format"}  # old key -> new (pipeline.config)

    experiment: str = "default"
    student: str = "smollm2"  # hub id, local dir, or "smollm2" (the embedded SmolLM2-135M-Instruct)
    student_name: str | None = None  # folder label; default: derived from `student`
    init: Literal["pretrained", "random"] = "pretrained"  # random: tests only, with `random_model` dims
    random_model: dict = field(default_factory=dict)  # LlamaConfig kwargs, e.g. hidden_size: 64
    tokenizer: str | None = None  # default: the student's own
    trust_remote_code: bool = False
    size_class: str = "8b"  # picks the paper's step schedule: 8b | 62b (7b/135m -> 8b, 70b/72b -> 62b)
    format: str = "react"  # the trajectory format to learn: standard | cot | act | react
    dataset_dir: Path = Path("data/sft")  # reads <dataset_dir>/<format>/train.jsonl
    output_root: Path = Path("checkpoints")
    output_dir: Path | None = None  # default: <output_root>/<experiment>/<student_name>/<format>
    accelerate_config: str = "auto"  # for `python -m pipeline train`: auto | cpu | cpu_ddp | multi_gpu | ... | a path
    num_processes: int | None = None  # for `train`: override the accelerate config's process count
    global_batch_size: int = 64
    per_device_batch_size: int | None = None  # default: the largest divisor <= max_per_device_batch_size
    max_per_device_batch_size: int = 8
    max_steps: int | None = None  # default: PAPER_STEPS[size class][format]
    learning_rate: float = 2e-5
    lr_scheduler: str = "cosine"
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch"
    finetuning: Literal["full", "lora", "qlora"] = "full"
    lora: LoraSettings = field(default_factory=LoraSettings)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on a bf16 GPU, else fp32
    attn_implementation: str | None = "sdpa"
    gradient_checkpointing: bool = False
    batching: Literal["padding_free", "packing", "padded"] = "padding_free"
    mask_observations: bool = False  # False = the paper: observations are in the loss
    max_length: int | None = None  # None: sized from the data (nothing truncated)
    long_examples: Literal["drop", "error"] = "drop"  # with max_length: drop (reported) or refuse
    max_examples: int | None = None  # use the first N records (smoke runs)
    save_steps: int = 500
    save_total_limit: int | None = 3
    logging_steps: int = 10
    report_to: str = "tensorboard"  # offline event files under <output_dir>/runs; "none" to disable
    seed: int = 0
    resume: str = "latest"  # latest (complete checkpoint, if any) | none | a checkpoint path
    dataloader_num_workers: int = 0


# ----------------------------------------------------------------------------- configuration

def resolve(cfg: FinetuneConfig) -> FinetuneConfig:
    """Fill the defaults that depend on other keys (steps, names, folders) and check values."""
    if cfg.format not in FORMATS:
        raise PipelineError(f"format: '{cfg.format}' is not one of {', '.join(FORMATS)}")
    if cfg.max_steps is None:
        cfg.max_steps = paper_max_steps(cfg.format, cfg.size_class)
    if cfg.max_steps < 1:
        raise PipelineError(f"max_steps must be >= 1, got {cfg.max_steps}")
    if cfg.init == "random" and not cfg.tokenizer:
        raise PipelineError("init: random needs `tokenizer` (a path or 'smollm2') to size the vocabulary")
    if cfg.init == "random" and cfg.finetuning != "full":
        raise PipelineError(f"init: random trains from scratch, so finetuning must be full (an adapter on an unsaved random base is useless), got {cfg.finetuning}")
    if cfg.student_name is None:
        cfg.student_name = model_label(cfg.student)
    if cfg.output_dir is None:
        cfg.output_dir = cfg.output_root / cfg.experiment / cfg.student_name / cfg.format
    return cfg


def paper_max_steps(fmt: str, size_class: str) -> int:
    schedule = SIZE_CLASS_SCHEDULE.get(size_class.lower())
    if schedule is None:
        raise PipelineError(f"size_class: '{size_class}' has no step schedule; use one of "
                            f"{', '.join(SIZE_CLASS_SCHEDULE)} or set max_steps")
    return PAPER_STEPS[schedule][fmt]


# ----------------------------------------------------------------------------- checkpoints

def is_complete_checkpoint(path: Path) -> bool:
    """A checkpoint is usable only when the trainer finished writing it: trainer_state.json is
    written last (and must parse), and the weights and optimizer state must be there."""
    state = path / "trainer_state.json"
    try:
        step = json.loads(state.read_text(encoding="utf-8")).get("global_step")
    except (OSError, json.JSONDecodeError):
        return False
    if not isinstance(step, int) or path.name != f"{CHECKPOINT_PREFIX}{step}":
        return False
    if not any((path / name).is_file() for name in WEIGHT_FILES) and not _deepspeed_state(path):
        return False
    return (path / "optimizer.pt").is_file() or _deepspeed_state(path)


def _deepspeed_state(path: Path) -> bool:
    latest = path / "latest"  # DeepSpeed writes latest -> global_stepN/ with the sharded states
    return latest.is_file() and (path / latest.read_text().strip()).is_dir()


def checkpoint_step(path: Path) -> int:
    suffix = path.name[len(CHECKPOINT_PREFIX):]
    return int(suffix) if path.name.startswith(CHECKPOINT_PREFIX) and suffix.isdigit() else -1


def list_checkpoints(output_dir: Path) -> list[Path]:
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) >= 0]
    return sorted(found, key=checkpoint_step)


def latest_complete_checkpoint(output_dir: Path) -> Path | None:
    complete = [p for p in list_checkpoints(output_dir) if is_complete_checkpoint(p)]
    return complete[-1] if complete else None


def set_aside_incomplete(output_dir: Path) -> list[Path]:
    """Rename incomplete checkpoint folders (a run killed mid-save) so that neither resume nor the
    trainer's rotation mistakes them for real ones; returns their new paths. Rank 0 only."""
    moved = []
    for path in list_checkpoints(output_dir):
        if not is_complete_checkpoint(path):
            target = path.with_name(f"incomplete-{path.name}-{int(time.time())}")
            path.rename(target)
            moved.append(target)
    return moved


def choose_resume(cfg: FinetuneConfig) -> Path | None:
    if cfg.resume == "none":
        return None
    if cfg.resume == "latest":
        return latest_complete_checkpoint(cfg.output_dir)
    path = Path(cfg.resume)
    if not is_complete_checkpoint(path):
        raise PipelineError(f"resume: {path} is not a complete checkpoint (needs trainer_state.json, weights, optimizer state)")
    return path


# ----------------------------------------------------------------------------- data and model

def load_sft_records(cfg: FinetuneConfig) -> tuple[Path, list[dict]]:
    folder = cfg.dataset_dir / cfg.format
    path = folder / "train.jsonl"
    if not path.is_file():
        raise PipelineError(f"dataset_dir: {path} not found; run `python -m pipeline filter` first (or set dataset_dir)")
    require_complete(folder / "manifest.json", f"SFT dataset {folder}")
    records = read_jsonl(path, tolerate_torn_tail=False)
    if cfg.max_examples is not None:
        records = records[: cfg.max_examples]
    if not records:
        raise PipelineError(f"{path}: no training examples")
    return path, records


def load_tokenizer(cfg: FinetuneConfig):
    tokenizer = models.load_tokenizer(cfg.tokenizer or cfg.student, key="tokenizer" if cfg.tokenizer else "student",
                                      trust_remote_code=cfg.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # labels mask padding, so sharing EOS is harmless
    return tokenizer


def use_bf16(cfg: FinetuneConfig) -> bool:
    import torch
    cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if cfg.precision == "bf16" and not cuda_bf16:
        raise PipelineError("precision: bf16 needs a GPU with bf16 support; use precision=fp32 on CPU")
    return cfg.precision == "bf16" or (cfg.precision == "auto" and cuda_bf16)


def load_student(cfg: FinetuneConfig, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if cfg.init == "random":
        torch.manual_seed(cfg.seed)  # identical on every rank
        dims = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 4, "intermediate_size": 128, "max_position_embeddings": 2048,
                **cfg.random_model}
        config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **dims)
        config._attn_implementation = cfg.attn_implementation or "sdpa"
        return LlamaForCausalLM(config)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    bf16 = use_bf16(cfg)
    if cfg.finetuning == "qlora":
        kwargs["quantization_config"] = qlora_quantization(bf16)
    # Adapters train on a frozen base: keep it in bf16 on GPU. Full fine-tuning keeps fp32 master
    # weights (bf16 autocast), as mixed precision requires.
    kwargs["dtype"] = torch.bfloat16 if bf16 and cfg.finetuning != "full" else torch.float32
    name = resolve_model_path(cfg.student)
    try:
        return AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except OSError as exc:
        raise PipelineError(f"student: cannot load '{name}' ({str(exc).splitlines()[0]})") from None


def qlora_quantization(bf16: bool):
    import importlib.util

    import torch
    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        raise PipelineError("finetuning: qlora needs CUDA and bitsandbytes (pip install bitsandbytes); use lora on this machine")
    from transformers import BitsAndBytesConfig
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16 if bf16 else torch.float16)


def peft_config(cfg: FinetuneConfig):
    if cfg.finetuning == "full":
        return None
    from peft import LoraConfig
    return LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")


# ----------------------------------------------------------------------------- trainer

def model_loss_trainer_class():
    """SFTTrainer whose loss is the model's own cross-entropy (Trainer.compute_loss).

    TRL 1.16's default loss runs a fused, chunked log-prob LM head whose non-Triton fallback is
    several times slower on CPU (bench/bench_train.py measures it) and gives the same loss. TRL's only
    switches that bypass it (compute_loss_func, label smoothing) still run the fused head for
    metrics, so the override is the supported route: it is the base Trainer's method."""
    from transformers import Trainer
    from trl import SFTTrainer

    class ModelLossSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs["use_cache"] = False
            return Trainer.compute_loss(self, model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    return ModelLossSFTTrainer


def sft_arguments(cfg: FinetuneConfig, per_device: int, grad_accum: int, max_length: int, bf16: bool,
                  distributed_cpu: bool):
    import torch
    from trl import SFTConfig
    packing = cfg.batching == "packing"
    # TRL turns activation (gradient) checkpointing ON by default; ours is the config's choice.
    # transformers 5.24 renamed it to activation_checkpointing (the old name warns).
    names = {f.name for f in dataclasses.fields(SFTConfig)}
    prefix = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    extra: dict[str, Any] = {prefix: cfg.gradient_checkpointing}
    if cfg.gradient_checkpointing:
        extra[f"{prefix}_kwargs"] = {"use_reentrant": False}
    return SFTConfig(
        output_dir=str(cfg.output_dir),
        max_steps=cfg.max_steps,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=grad_accum,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=math.ceil(cfg.warmup_ratio * cfg.max_steps),
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        optim=cfg.optim,
        bf16=bf16,
        fp16=cfg.precision == "fp16",
        # Our labels are final (prompt masked, EOS trained, nothing truncated): TRL must not
        # re-tokenise or truncate. Packing alone needs TRL's preparation pass (BFD), with a
        # max_length no shorter than the longest example, so it never cuts one.
        dataset_kwargs=None if packing else {"skip_prepare_dataset": True},
        max_length=max_length if packing else None,
        packing=packing,
        packing_strategy="bfd",
        padding_free=cfg.batching == "padding_free",
        completion_only_loss=False,
        shuffle_dataset=False,  # the trainer's seeded sampler shuffles; resume replays it exactly
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=cfg.dataloader_num_workers,
        # DDP on CPU: accelerate's multi-process launcher does not pass the config's use_cpu on,
        # so say it here; never under DeepSpeed: with use_cpu=True the trainer silently runs without it.
        use_cpu=distributed_cpu and not under_deepspeed(),
        ddp_backend="gloo" if distributed_cpu else None,
        ddp_find_unused_parameters=False if distributed_cpu else None,
        remove_unused_columns=False,
        dataloader_pin_memory=torch.cuda.is_available(),
        disable_tqdm=False,
        **extra,
    )


def build_trainer(cfg: FinetuneConfig, examples: list[dict], tokenizer, per_device: int, grad_accum: int,
                  max_length: int, callbacks: list | None = None):
    import torch
    from datasets import Dataset

    distributed_cpu = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    bf16 = use_bf16(cfg)
    args = sft_arguments(cfg, per_device, grad_accum, max_length, bf16, distributed_cpu)
    model = load_student(cfg, tokenizer)
    dataset = Dataset.from_list(examples)
    trainer_class = model_loss_trainer_class()
    return trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config(cfg), callbacks=callbacks)


def under_deepspeed() -> bool:
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true")


def count_processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run(cfg: FinetuneConfig) -> dict:
    """Train (or resume) and save the final model; returns the final manifest."""
    from pipeline.sft import split_batch, tokenize_records

    cfg = resolve(cfg)
    final = cfg.output_dir / FINAL_DIR
    if is_done(final / "manifest.json", steps=cfg.max_steps):
        print(f"[finetune] {final} is already complete ({cfg.max_steps} steps); nothing to do")
        return read_manifest(final / "manifest.json")
    num_processes = count_processes()
    per_device, grad_accum = split_batch(cfg.global_batch_size, num_processes, cfg.per_device_batch_size,
                                         cfg.max_per_device_batch_size)
    dataset_path, records = load_sft_records(cfg)
    tokenizer = load_tokenizer(cfg)
    examples, report = tokenize_records(records, tokenizer, mask_observations=cfg.mask_observations,
                                        max_length=cfg.max_length, long_examples=cfg.long_examples)
    if not examples:
        raise PipelineError(f"{dataset_path}: every example is longer than max_length={cfg.max_length}")
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        print(f"[finetune] {cfg.format} on {cfg.student_name}: {report.summary()}")
        print(f"[finetune] batch {cfg.global_batch_size} = {per_device} per device x {grad_accum} accumulation "
              f"x {num_processes} processes; {cfg.max_steps} steps; output {cfg.output_dir}")
    trainer = build_trainer(cfg, examples, tokenizer, per_device, grad_accum, report.max_length)
    if rank0:
        for path in set_aside_incomplete(cfg.output_dir):
            print(f"[finetune] set aside an incomplete checkpoint: {path}")
    trainer.accelerator.wait_for_everyone()
    resume = choose_resume(cfg)
    if rank0:
        print(f"[finetune] {'resuming from ' + str(resume) if resume else 'starting from step 0'}")
    started = time.time()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    manifest = save_final(trainer, cfg, tokenizer, dataset_path, report, result, started,
                          per_device, grad_accum, num_processes)
    return manifest


def save_final(trainer, cfg: FinetuneConfig, tokenizer, dataset_path: Path, report, result, started: float,
               per_device: int, grad_accum: int, num_processes: int) -> dict:
    """Save model (or adapter) + tokenizer to <output_dir>/final.partial, then rename to final."""
    import shutil
    final = cfg.output_dir / FINAL_DIR
    partial = cfg.output_dir / f"{FINAL_DIR}.partial"
    rank0 = trainer.accelerator.is_main_process
    if rank0 and partial.exists():
        shutil.rmtree(partial)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(partial))  # every rank joins (ZeRO-3 gathers the shards)
    manifest: dict = {}
    if rank0:
        tokenizer.save_pretrained(str(partial))
        adapter = cfg.finetuning != "full"
        manifest = write_manifest(
            partial / "manifest.json", stage="train", config=to_dict(cfg), complete=True,
            student=cfg.student_name, base_model=None if cfg.init == "random" else resolve_model_path(cfg.student),
            init=cfg.init, adapter=adapter, finetuning=cfg.finetuning, format=cfg.format,
            size_class=cfg.size_class, steps=trainer.state.global_step, max_steps=cfg.max_steps,
            tokenizer=".", tokenizer_source=cfg.tokenizer or cfg.student, eos_token=tokenizer.eos_token,
            prompt_format="Question: {question}\n", mask_observations=cfg.mask_observations,
            params_b=sum(getattr(p, "ds_numel", p.numel()) for p in trainer.model.parameters()) / 1e9,  # ZeRO-3 shards: ds_numel
            global_batch_size=cfg.global_batch_size, per_device_batch_size=per_device,
            gradient_accumulation_steps=grad_accum, num_processes=num_processes,
            dataset={**file_fingerprint(dataset_path), "examples": report.n_kept}, lengths=report.to_dict(),
            train_loss=getattr(result, "training_loss", None), seconds=round(time.time() - started, 1),
        )
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        print(f"[finetune] saved {'adapter' if adapter else 'model'} to {final}")
    trainer.accelerator.wait_for_everyone()
    return manifest


def load_finetuned(final_dir: str | Path, merge: bool = True, dtype=None):
    """(model, tokenizer) from a `final` folder; a LoRA adapter is put on its base model and
    merged (merge=True) so eval gets a plain causal LM. Refuses an incomplete folder."""
    from transformers import AutoModelForCausalLM
    final_dir = Path(final_dir)
    manifest = require_complete(final_dir / "manifest.json", f"fine-tuned model {final_dir}")
    tokenizer = models.load_tokenizer(str(final_dir), key="checkpoint")
    if not manifest.get("adapter"):
        return AutoModelForCausalLM.from_pretrained(final_dir, dtype=dtype), tokenizer
    from peft import PeftModel
    base = AutoModelForCausalLM.from_pretrained(manifest["base_model"], dtype=dtype)
    model = PeftModel.from_pretrained(base, final_dir)
    return (model.merge_and_unload() if merge else model), tokenizer


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m pipeline.finetune", description=__doc__.split("\n")[0])
    add_config_arguments(parser, FinetuneConfig)
    args = parser.parse_args(argv)
    try:
        run(stage_config(FinetuneConfig, args, section="train", finish=resolve))
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
