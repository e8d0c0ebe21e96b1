"""The config of a fine-tuning run (`train:` section, configs/students/*.yaml) and the defaults that
depend on other keys: the paper's step schedule by format and size class, names and folders.

    python -m pipeline train --config configs/students/tiny.yaml --print-config
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from pipeline.core.config import at_least, checked, folder_name, in_range, listed
from pipeline.core.errors import PipelineError
from pipeline.core.trajectory import FORMATS
from pipeline.hub.models import model_label
from pipeline.train.settings import check_optim, check_report_to, check_scheduler, trl_synonyms

# Paper (appendix B.1): batch 64; steps by size class and trajectory format.
PAPER_STEPS = {
    "8b": {"react": 4000, "act": 4000, "standard": 2000, "cot": 2000},
    "62b": {"react": 4000, "act": 4000, "standard": 1000, "cot": 1000},
}
# Open-model size classes map onto the paper's two (7B/8B -> 8b; 70B/72B -> 62b); smaller
# demo students use the 8b schedule.
SIZE_CLASS_SCHEDULE = {"8b": "8b", "7b": "8b", "135m": "8b", "270m": "8b", "tiny": "8b", "62b": "62b", "70b": "62b", "72b": "62b"}

FINAL_DIR = "final"


@dataclass
class LoraSettings:
    r: int = at_least(1, default=16)
    alpha: int = at_least(1, default=32)
    dropout: float = checked(in_range(0, 1, below=True), default=0.05)  # PEFT: a probability below 1
    target_modules: list[str] = checked(listed, default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                         "gate_proj", "up_proj", "down_proj"])


@dataclass
class FinetuneConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"method": "format"}  # old key -> new (pipeline.core.config)
    # TRL SFTConfig's (and its scripts') names of our keys: their did-you-mean (pipeline.core.config)
    SYNONYMS: ClassVar[dict[str, tuple[str, str]]] = trl_synonyms({
        "packing": "batching", "padding_free": "batching", "completion_only_loss": "mask_observations",
        "assistant_only_loss": "mask_observations", "dataset_name": "dataset_dir",
        "num_train_epochs": "max_steps"}) | {"max_seq_length": ("max_length", "TRL's older")}

    experiment: str = checked(folder_name, default="default")  # a folder under output_root
    student: str = "smollm2"  # hub id, local dir, or "smollm2" (the embedded SmolLM2-135M-Instruct)
    student_name: str | None = checked(folder_name, default=None)  # folder label; default: derived from `student`
    init: Literal["pretrained", "random"] = "pretrained"  # random: tests only, with `random_model` dims
    random_model: dict = field(default_factory=dict)  # LlamaConfig kwargs, e.g. hidden_size: 64
    tokenizer: str | None = None  # default: the student's own
    trust_remote_code: bool = False
    size_class: str = "8b"  # picks the paper's step schedule: 8b | 62b (7b/135m -> 8b, 70b/72b -> 62b)
    format: str = "react"  # the trajectory format to learn: standard | cot | act | react
    # text: <format>/train.jsonl, the paper's prompt / completion; messages: <format>/messages.jsonl, chat
    # messages with tool calls under the chat template, the assistant's turns alone in the loss (docs/formats.md)
    layout: Literal["text", "messages"] = "text"
    # layout=messages: a Jinja file or smollm2-tool-calls (pipeline/hub/smollm2_tool_calls.jinja); default:
    # the tokenizer's own when it marks the assistant's turns ({% generation %}), the shipped one for SmolLM2
    chat_template: str | None = None
    dataset_dir: Path = Path("data/sft")  # reads <dataset_dir>/<format>/train.jsonl (messages.jsonl for layout=messages)
    output_root: Path = Path("checkpoints")
    output_dir: Path | None = None  # default: <output_root>/<experiment>/<student_name>/<format> (<format>-messages for layout=messages)
    accelerate_config: str = "auto"  # for `python -m pipeline train`: auto | cpu | cpu_ddp | multi_gpu | ... | a path
    num_processes: int | None = at_least(1, default=None)  # for `train`: override the accelerate config's process count
    deepspeed_on_cpu: bool = False  # true: run a deepspeed_* accelerate config on CPU processes on purpose (tests; fp32 only)
    global_batch_size: int = at_least(1, default=64)
    per_device_batch_size: int | None = at_least(1, default=None)  # default: the largest divisor <= max_per_device_batch_size (1 for padding_free without a varlen flash kernel: pipeline/train/speed.py)
    max_per_device_batch_size: int = at_least(1, default=8)
    max_steps: int | None = at_least(1, default=None)  # default: PAPER_STEPS[size class][format]
    learning_rate: float = checked(in_range(0, above=True), default=2e-5)
    lr_scheduler: str = checked(check_scheduler, default="cosine")  # transformers' SchedulerType
    warmup_ratio: float = checked(in_range(0, 1), default=0.03)  # a share of max_steps
    weight_decay: float = checked(in_range(0), default=0.0)
    max_grad_norm: float = checked(in_range(0), default=1.0)  # 0: no clipping
    optim: str = checked(check_optim, default="adamw_torch")  # transformers' OptimizerNames
    finetuning: Literal["full", "lora", "qlora"] = "full"
    lora: LoraSettings = field(default_factory=LoraSettings)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on a bf16 GPU or CPU, else fp32
    attn_implementation: str | None = "auto"  # auto: varlen flash on CUDA where installed, else sdpa (pipeline/train/speed.py)
    loss: Literal["auto", "model", "chunked"] = "auto"  # auto: TRL's chunked LM-head loss on GPUs, the model's own on CPU
    peak_tflops: float | None = checked(in_range(0, above=True), default=None)  # per device, for MFU; default: the GPU's from pipeline/train/flops.py's table
    gradient_checkpointing: bool = False
    batching: Literal["padding_free", "packing", "padded"] = "padding_free"  # all: global_batch_size trajectories per step
    mask_observations: bool = False  # False = the paper: observations are in the loss
    max_length: int | None = at_least(1, default=None)  # None: sized from the data (nothing truncated)
    long_examples: Literal["drop", "error"] = "drop"  # with max_length: drop (reported) or refuse
    max_examples: int | None = at_least(1, default=None)  # use the first N records (smoke runs)
    save_steps: int = at_least(1, default=500)
    save_total_limit: int | None = at_least(1, default=3)
    keep_checkpoints: bool = True  # false: delete checkpoint-*/ (optimizer state: ~128 GB each at 8B) once final/ is complete
    logging_steps: int = at_least(1, default=10)
    report_to: str = checked(check_report_to, default="tensorboard")  # offline event files under <output_dir>/runs; "none" to disable
    seed: int = at_least(0, default=0)
    resume: str = "latest"  # latest (complete checkpoint, if any) | none | a checkpoint path
    dataloader_num_workers: int = at_least(0, default=0)


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
    if cfg.layout == "messages" and cfg.mask_observations:
        raise PipelineError("mask_observations: layout=messages never trains on observations (the assistant's turns "
                            "alone are in the loss); drop the key")
    if cfg.chat_template and cfg.layout != "messages":
        raise PipelineError("chat_template: layout=text trains on the paper's text, no chat template; drop the key "
                            "or set layout=messages")
    if cfg.output_dir is None:
        folder = cfg.format if cfg.layout == "text" else f"{cfg.format}-messages"  # never the text student's folder
        cfg.output_dir = cfg.output_root / cfg.experiment / cfg.student_name / folder
    return cfg


def paper_max_steps(fmt: str, size_class: str) -> int:
    schedule = SIZE_CLASS_SCHEDULE.get(size_class.lower())
    if schedule is None:
        raise PipelineError(f"size_class: '{size_class}' has no step schedule; use one of "
                            f"{', '.join(SIZE_CLASS_SCHEDULE)} or set max_steps")
    if fmt not in PAPER_STEPS[schedule]:  # a format the paper did not train on
        raise PipelineError(f"format: '{fmt}' has no step count in the paper's schedule; set max_steps")
    return PAPER_STEPS[schedule][fmt]
