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
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pipeline.core.config import add_config_arguments, stage_config, to_dict
from pipeline.core.errors import PipelineError, os_error_message
from pipeline.core.storage import (
    atomic_write_json,
    file_fingerprint,
    is_done,
    read_jsonl,
    read_manifest,
    require_complete,
    write_manifest,
)
from pipeline.core.trajectory import FORMATS
from pipeline.deepspeed_setup import (
    check_deepspeed_device,
    deepspeed_line,
    deepspeed_record,
    settle_deepspeed_config,
    under_deepspeed,
)
from pipeline.hub import models
from pipeline.hub.models import model_label, resolve_model_path
from pipeline.train_checks import (  # noqa: F401  (is_complete_checkpoint: re-exported)
    Layout,
    check_config,
    check_devices,
    check_resume_layout,
    checkpoint_step,
    incomplete_reason,
    is_complete_checkpoint,
    launch_strategy,
    layout_callback,
    saved_layout,
)
from pipeline.train_speed import (
    choose_attention,
    choose_loss,
    fsdp_plan,
    installed_kernels,
    micro_batch_cap,
)

# Paper (appendix B.1): batch 64; steps by size class and trajectory format.
PAPER_STEPS = {
    "8b": {"react": 4000, "act": 4000, "standard": 2000, "cot": 2000},
    "62b": {"react": 4000, "act": 4000, "standard": 1000, "cot": 1000},
}
# Open-model size classes map onto the paper's two (7B/8B -> 8b; 70B/72B -> 62b); smaller
# demo students use the 8b schedule.
SIZE_CLASS_SCHEDULE = {"8b": "8b", "7b": "8b", "135m": "8b", "tiny": "8b", "62b": "62b", "70b": "62b", "72b": "62b"}

FINAL_DIR = "final"


@dataclass
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"])


@dataclass
class FinetuneConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"method": "format"}  # old key -> new (pipeline.core.config)

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
    deepspeed_on_cpu: bool = False  # true: run a deepspeed_* accelerate config on CPU processes on purpose (tests; fp32 only)
    global_batch_size: int = 64
    per_device_batch_size: int | None = None  # default: the largest divisor <= max_per_device_batch_size (1 for padding_free without a varlen flash kernel: pipeline/train_speed.py)
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
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on a bf16 GPU or CPU, else fp32
    attn_implementation: str | None = "auto"  # auto: varlen flash on CUDA where installed, else sdpa (pipeline/train_speed.py)
    loss: Literal["auto", "model", "chunked"] = "auto"  # auto: TRL's chunked LM-head loss on GPUs, the model's own on CPU
    peak_tflops: float | None = None  # per device, for MFU; default: the GPU's from pipeline/flops.py's table
    gradient_checkpointing: bool = False
    batching: Literal["padding_free", "packing", "padded"] = "padding_free"  # all: global_batch_size trajectories per step
    mask_observations: bool = False  # False = the paper: observations are in the loss
    max_length: int | None = None  # None: sized from the data (nothing truncated)
    long_examples: Literal["drop", "error"] = "drop"  # with max_length: drop (reported) or refuse
    max_examples: int | None = None  # use the first N records (smoke runs)
    save_steps: int = 500
    save_total_limit: int | None = 3
    keep_checkpoints: bool = True  # false: delete checkpoint-*/ (optimizer state: ~128 GB each at 8B) once final/ is complete
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

def list_checkpoints(output_dir: Path) -> list[Path]:
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) >= 0]
    return sorted(found, key=checkpoint_step)


def latest_complete_checkpoint(output_dir: Path) -> Path | None:
    complete = [p for p in list_checkpoints(output_dir) if is_complete_checkpoint(p)]
    return complete[-1] if complete else None


def set_aside_incomplete(output_dir: Path) -> list[tuple[Path, str]]:
    """Rename incomplete checkpoint folders (a run killed mid-save) so that neither resume nor the
    trainer's rotation mistakes them for real ones; returns their new paths, each with what it
    lacked. Rank 0 only."""
    moved = []
    for path in list_checkpoints(output_dir):
        why = incomplete_reason(path)
        if why is not None:
            target = path.with_name(f"incomplete-{path.name}-{int(time.time())}")
            path.rename(target)
            moved.append((target, why))
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

def check_dataset(cfg: FinetuneConfig) -> Path:
    """The format's train.jsonl, refused unless present and complete by its manifest (the
    `train` stage calls this too, before it launches anything)."""
    folder = cfg.dataset_dir / cfg.format
    path = folder / "train.jsonl"
    if not path.is_file():
        raise PipelineError(f"dataset_dir: {path} not found; run `python -m pipeline filter` first (or set dataset_dir)")
    require_complete(folder / "manifest.json", f"SFT dataset {folder}")
    return path


def dataset_task(dataset_path: Path):
    """The task the SFT dataset's trajectories answer, from its manifest (pipeline.tasks.task_of)."""
    from pipeline.tasks import get_task, task_of

    return get_task(task_of(read_manifest(dataset_path.parent / "manifest.json")))


def load_sft_records(cfg: FinetuneConfig) -> tuple[Path, list[dict]]:
    path = check_dataset(cfg)
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
        tokenizer.pad_token = own_pad_token(tokenizer) or tokenizer.eos_token  # labels mask padding either way
    return tokenizer


# Padding tokens some tokenizers define without declaring them (Llama-3.x: reserved for fine-tuning).
OWN_PAD_TOKENS = ("<|finetune_right_pad_id|>", "<|finetune_right_pad|>", "<|pad|>", "<pad>", "[PAD]")


def own_pad_token(tokenizer) -> str | None:
    """The model's own padding token where its vocabulary has one: distinct from EOS, so that
    padding is never counted (or generated) as an end of sequence."""
    vocab = tokenizer.get_vocab()
    return next((token for token in OWN_PAD_TOKENS if token in vocab), None)


def precision_choice(cfg: FinetuneConfig):
    """bf16 / fp32 / fp16 for this run and why (pipeline/core/precision.py has the rule)."""
    from pipeline.core import precision
    return precision.training(cfg.precision, deepspeed=under_deepspeed())


def weights_choice(cfg: FinetuneConfig):
    """The dtype the student loads in and why (pipeline/core/precision.py: weights)."""
    from pipeline.core import precision
    return precision.weights(precision_choice(cfg).precision, cfg.finetuning, launch_strategy())


def use_bf16(cfg: FinetuneConfig) -> bool:
    return precision_choice(cfg).precision == "bf16"


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
        config._attn_implementation = attention_choice(cfg)[0]
        return LlamaForCausalLM(config).to(weights_choice(cfg).torch_dtype)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    kwargs["attn_implementation"] = attention_choice(cfg)[0]
    if cfg.finetuning == "qlora":
        kwargs["quantization_config"] = qlora_quantization(use_bf16(cfg))
    kwargs["dtype"] = weights_choice(cfg).torch_dtype
    name = resolve_model_path(cfg.student)
    try:
        return AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except OSError as exc:
        raise PipelineError(f"student: cannot load '{name}' ({str(exc).splitlines()[0]})") from None


def attention_choice(cfg: FinetuneConfig) -> tuple[str, str]:
    half = cfg.precision in ("bf16", "fp16") or (cfg.precision == "auto" and use_bf16(cfg))
    return choose_attention(cfg.attn_implementation, installed_kernels(), half)


def batch_split(cfg: FinetuneConfig, num_processes: int) -> tuple[int, int, str | None]:
    """(per-device batch, accumulation steps, why the micro-batch was capped or None): the one
    rule `train` prints and the launched child uses. An explicit per_device_batch_size is kept."""
    from pipeline.sft import split_batch
    cap, why = cfg.max_per_device_batch_size, None
    if cfg.per_device_batch_size is None:
        cap, why = micro_batch_cap(cfg.batching, attention_choice(cfg)[0], cap)
    per_device, accum = split_batch(cfg.global_batch_size, num_processes, cfg.per_device_batch_size, cap)
    return per_device, accum, why


def qlora_quantization(bf16: bool):
    import importlib.util

    import torch
    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        raise PipelineError("finetuning: qlora needs CUDA and bitsandbytes (pip install bitsandbytes); use lora on this machine")
    return bnb_4bit_config(bf16)


def bnb_4bit_config(bf16: bool):
    import torch
    from transformers import BitsAndBytesConfig
    compute = torch.bfloat16 if bf16 else torch.float16
    # The 4-bit weights are stored packed in a tensor of dtype quant_storage. ZeRO-3 and FSDP shard
    # and all-gather parameters as floating tensors of one dtype: the default uint8 storage breaks
    # ZeRO-3's gather and makes FSDP2 leave the 4-bit base unsharded (accelerate fsdp_utils).
    # Storing in the compute dtype is what both need, and changes nothing on one GPU.
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute, bnb_4bit_quant_storage=compute)


def peft_config(cfg: FinetuneConfig):
    if cfg.finetuning == "full":
        return None
    from peft import LoraConfig
    return LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")


# ----------------------------------------------------------------------------- trainer

def sft_trainer_class(loss: str = "model"):
    """SFTTrainer with the chosen loss path (pipeline/train_speed.py: choose_loss) whose log()
    adds the throughput figures (tokens/s, TFLOP/s, MFU) of each logged step.

    loss="model": the model's own cross-entropy (Trainer.compute_loss). TRL 1.16's default loss
    runs a fused, chunked log-prob LM head whose non-Triton fallback is several times slower on
    CPU (bench/bench_train.py measures it) and gives the same loss. TRL's only switches that bypass it
    (compute_loss_func, label smoothing) still run the fused head for metrics, so the override
    is the supported route: it is the base Trainer's method. loss="chunked": TRL's own."""
    from transformers import Trainer
    from trl import SFTTrainer

    class PipelineSFTTrainer(SFTTrainer):
        throughput = None  # a pipeline.flops.ThroughputMeter (build_trainer sets it)

        def log(self, logs, *args, **kwargs):
            if self.throughput is not None and "loss" in logs:
                logs.update(self.throughput.metrics(self.state.num_input_tokens_seen))
            super().log(logs, *args, **kwargs)

    if loss == "chunked":
        return PipelineSFTTrainer

    class ModelLossSFTTrainer(PipelineSFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs["use_cache"] = False
            return Trainer.compute_loss(self, model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    return ModelLossSFTTrainer


def model_loss_trainer_class():
    return sft_trainer_class("model")


def sft_arguments(cfg: FinetuneConfig, per_device: int, grad_accum: int, max_length: int, bf16: bool,
                  distributed_cpu: bool):
    import torch
    from trl import SFTConfig
    # TRL turns activation (gradient) checkpointing ON by default; ours is the config's choice,
    # and under FSDP it is FSDP's own (accelerate config), never transformers' too.
    # transformers 5.24 renamed it to activation_checkpointing (the old name warns).
    checkpointing = fsdp_plan(cfg.gradient_checkpointing).transformers_checkpointing
    names = {f.name for f in dataclasses.fields(SFTConfig)}
    prefix = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    extra: dict[str, Any] = {prefix: checkpointing}
    if checkpointing:
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
        # re-tokenise, truncate, or pack the dataset (its packing would make a batch count rows,
        # not trajectories): `packing` is our collator's (pipeline/batching.py).
        dataset_kwargs={"skip_prepare_dataset": True},
        max_length=None,
        packing=False,
        padding_free=cfg.batching == "padding_free",
        completion_only_loss=False,
        shuffle_dataset=False,  # the trainer's seeded sampler shuffles; resume replays it exactly
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        # tokens per logged step, for MFU (one scalar all-gather per micro-batch)
        include_num_input_tokens_seen="all" if cfg.batching == "padding_free" else "non_padding",
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=cfg.dataloader_num_workers,
        # DDP on CPU: accelerate's multi-process launcher does not pass the config's use_cpu on,
        # so say it here; never under DeepSpeed: with use_cpu=True the trainer silently runs without it.
        # bf16 without a GPU also needs use_cpu (transformers refuses bf16 otherwise; accelerate
        # then autocasts on the CPU).
        use_cpu=(distributed_cpu or (bf16 and not torch.cuda.is_available())) and not under_deepspeed(),
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

    from pipeline.batching import PackingCollator

    distributed_cpu = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    bf16 = use_bf16(cfg)
    args = sft_arguments(cfg, per_device, grad_accum, max_length, bf16, distributed_cpu)
    model = load_student(cfg, tokenizer)
    dataset = Dataset.from_list(examples)
    collator = PackingCollator(tokenizer.pad_token_id, max_length) if cfg.batching == "packing" else None
    trainer_class = sft_trainer_class(choose_loss(cfg.loss, torch.cuda.is_available())[0])
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                            data_collator=collator, peft_config=peft_config(cfg), callbacks=callbacks)
    trainer.throughput = throughput_meter(cfg, model.config, examples)
    trainer.add_callback(trainer.throughput.callback())
    return trainer


def throughput_meter(cfg: FinetuneConfig, model_config, examples: list[dict]):
    import torch

    from pipeline.flops import ThroughputMeter, attention_length, flops_per_token, peak_tflops
    per_token = flops_per_token(model_config, full_finetuning=cfg.finetuning == "full",
                                checkpointing=fsdp_plan(cfg.gradient_checkpointing).checkpointing,
                                attention_length=attention_length([len(e["input_ids"]) for e in examples]))
    peak = cfg.peak_tflops or (peak_tflops(torch.cuda.get_device_name()) if torch.cuda.is_available() else None)
    return ThroughputMeter(per_token, count_processes(), peak)


def check_launch(cfg: FinetuneConfig) -> None:
    """Config-time checks (pipeline/train_checks.py): this config, this launch, this node."""
    import importlib.util

    import torch
    check_devices()
    check_deepspeed_device(under_deepspeed(), torch.cuda.is_available(), cfg.deepspeed_on_cpu, count_processes())
    check_config(cfg.finetuning, cfg.optim, launch_strategy(), torch.cuda.is_available(),
                 importlib.util.find_spec("bitsandbytes") is not None)


def count_processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run(cfg: FinetuneConfig) -> dict:
    """Train (or resume) and save the final model; returns the final manifest."""
    from pipeline.sft import tokenize_records

    cfg = resolve(cfg)
    deepspeed = settle_deepspeed_config()  # before anything reads the launch's strategy
    final = cfg.output_dir / FINAL_DIR
    done = read_manifest(final / "manifest.json") if final.is_dir() else None
    choice = precision_choice(cfg)
    check_same_precision(done, choice.precision, final)
    if is_done(final / "manifest.json", steps=cfg.max_steps):
        print(f"[finetune] {final} is already complete ({cfg.max_steps} steps); nothing to do")
        return done
    check_launch(cfg)
    num_processes = count_processes()
    per_device, grad_accum, capped = batch_split(cfg, num_processes)
    dataset_path, records = load_sft_records(cfg)
    tokenizer = load_tokenizer(cfg)
    examples, report = tokenize_records(records, tokenizer, mask_observations=cfg.mask_observations,
                                        max_length=cfg.max_length, long_examples=cfg.long_examples)
    if not examples:
        raise PipelineError(f"{dataset_path}: every example is longer than max_length={cfg.max_length}")
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        print(choice.line("training"))
        print(weights_choice(cfg).line("weights"))
        if deepspeed:
            print(deepspeed_line(*deepspeed))
        print(f"[finetune] {cfg.format} on {cfg.student_name}: {report.summary()}")
        print(f"[finetune] batch {cfg.global_batch_size} = {per_device} per device x {grad_accum} accumulation "
              f"x {num_processes} processes; {cfg.max_steps} steps; output {cfg.output_dir}")
        import torch
        print(f"[finetune] {attention_choice(cfg)[1]}; {choose_loss(cfg.loss, torch.cuda.is_available())[1]}")
        if capped:
            print(f"[finetune] {capped}")
    layout = Layout(num_processes, per_device, grad_accum, cfg.global_batch_size, launch_strategy(), len(examples))
    trainer = build_trainer(cfg, examples, tokenizer, per_device, grad_accum, report.max_length,
                            callbacks=[layout_callback(layout)])
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
    manifest = save_final(trainer, cfg, tokenizer, dataset_path, report, result, started,
                          per_device, grad_accum, num_processes)
    return manifest


def check_same_precision(done: dict | None, precision: str, final: Path) -> None:
    """A finished model trained in another precision is not this run's result: say so, never skip."""
    was = (done or {}).get("precision")  # manifests older than the field: unknown, not checked
    if done and done.get("complete") and was and was != precision:
        raise PipelineError(f"{final} was trained in {was}, this run would train in {precision}; set "
                            f"precision={was}, or use another experiment / output_dir (or delete that "
                            "folder) to train afresh")


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
    if fsdp_plan(cfg.gradient_checkpointing).final_gather:
        save_fsdp_final(trainer, partial, use_bf16(cfg))
    else:
        trainer.save_model(str(partial))  # every rank joins (ZeRO-3 gathers the shards)
    manifest: dict = {}
    if rank0:
        tokenizer.save_pretrained(str(partial))
        adapter = cfg.finetuning != "full"
        task = dataset_task(dataset_path)
        manifest = write_manifest(
            partial / "manifest.json", stage="train", config=to_dict(cfg), complete=True,
            student=cfg.student_name, base_model=None if cfg.init == "random" else resolve_model_path(cfg.student),
            init=cfg.init, adapter=adapter, finetuning=cfg.finetuning, format=cfg.format,
            size_class=cfg.size_class, steps=trainer.state.global_step, max_steps=cfg.max_steps,
            tokenizer=".", tokenizer_source=cfg.tokenizer or cfg.student, eos_token=tokenizer.eos_token,
            task=task.name, prompt_format=f"{task.question_label}: {{question}}\n", mask_observations=cfg.mask_observations,
            params_b=sum(getattr(p, "ds_numel", p.numel()) for p in trainer.model.parameters()) / 1e9,  # ZeRO-3 shards: ds_numel
            global_batch_size=cfg.global_batch_size, per_device_batch_size=per_device,
            gradient_accumulation_steps=grad_accum, num_processes=num_processes,
            dataset={**file_fingerprint(dataset_path), "examples": report.n_kept}, lengths=report.to_dict(),
            train_loss=getattr(result, "training_loss", None), seconds=round(time.time() - started, 1),
            precision=precision_choice(cfg).precision, weights=weights_choice(cfg).precision,
            deepspeed=deepspeed_record(trainer),
        )
        from pipeline.hub.cards import model_card

        # The model card every checkpoint carries (replacing PEFT's template); `run` adds eval results.
        (partial / "README.md").write_text(model_card(manifest, []), encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        print(f"[finetune] saved {'adapter' if adapter else 'model'} to {final}")
        if not cfg.keep_checkpoints:
            freed = remove_checkpoints(cfg.output_dir)
            print(f"[finetune] keep_checkpoints: false: removed {len(freed)} checkpoint folder(s), "
                  f"{sum(size for _, size in freed) / 1e9:.1f} GB (final/ is complete)")
    trainer.accelerator.wait_for_everyone()
    return manifest


def remove_checkpoints(output_dir: Path) -> list[tuple[Path, int]]:
    """Delete every checkpoint-* (and set-aside incomplete-*) folder of a finished run: what is
    left is final/, all that eval and publish read. Returns (path, bytes) per folder. Rank 0 only,
    after final/ is in place, so a kill in between leaves a resumable or a finished run."""
    import shutil
    freed = []
    for path in sorted([*output_dir.glob("checkpoint-*"), *output_dir.glob("incomplete-checkpoint-*")]):
        if path.is_dir():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
            freed.append((path, size))
    return freed


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
    cfg = None
    try:
        cfg = stage_config(FinetuneConfig, args, section="train", finish=resolve)
        run(cfg)
    except PipelineError as exc:
        return report_error(str(exc), exc.exit_code)
    except Exception as exc:  # a full disk while checkpointing, an unwritable output_dir
        message = storage_error_message(exc, cfg.output_dir if cfg else None)
        if message is None:
            raise  # a bug: keep its traceback
        return report_error(message, 2)
    return 0


# What torch.save's C++ writer says when a write fails (it gives no errno): seen on a full disk.
TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed writing", "inline_container.cc", "iostream error")


def storage_error_message(exc: Exception, output_dir: Path | None) -> str | None:
    """One line for a failed write, whichever library raised it: an OSError, safetensors'
    SafetensorError ("I/O error: ... (os error 28)"), torch.save's RuntimeError ("unexpected
    pos ...", "iostream error"); None for anything else (a bug keeps its traceback)."""
    import re
    import shutil

    if isinstance(exc, OSError):
        return os_error_message(exc, output_dir)
    text = str(exc)
    code = re.search(r"\(os error (\d+)\)", text)
    if type(exc).__name__ == "SafetensorError" and code:
        number = int(code.group(1))
        return os_error_message(OSError(number, os.strerror(number)), output_dir)
    chain = [exc, exc.__context__]
    if output_dir is not None and any(isinstance(e, RuntimeError) and any(m in str(e) for m in TORCH_WRITE_FAILURES)
                                      for e in chain):
        free = shutil.disk_usage(output_dir).free / 1e6 if output_dir.exists() else float("nan")
        return (f"{output_dir}: writing a checkpoint failed ({text.splitlines()[0] if text else type(exc).__name__}; "
                f"{free:.1f} MB free there); free space (or check permissions) and re-run the same command: "
                "training resumes from the latest complete checkpoint")
    return None


# Set by the `train` stage: the child writes its one error line here instead of stderr, and
# the stage prints it once (not once per rank) without the launcher's traceback after it.
ERROR_FILE_ENV = "PIPELINE_ERROR_FILE"


def report_error(message: str, exit_code: int) -> int:
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file:
        try:
            atomic_write_json(error_file, {"message": message, "exit_code": exit_code})
            return exit_code
        except OSError:
            pass  # the stage cannot hear us: say it on stderr
    print(f"error: {message}", file=sys.stderr)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
