"""The `grpo` stage's config: where the student starts, the environment it acts in, the group
and batch sizes, the reward, and the same training keys as `train` where they mean the same.

    python -m pipeline grpo --help            # every key with its default and meaning
    python -m pipeline grpo --config configs/grpo/smollm2-135m.yaml student=<final/> --print-config

One optimizer step = `questions_per_step` questions x `group_size` rollouts each (TRL's
num_generations: GRPO's advantages compare the rollouts of one question). The rollouts are
split per device x accumulation x processes as `train` splits its batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.core.config import at_least
from pipeline.core.errors import PipelineError
from pipeline.methods import MethodSettings
from pipeline.train.config import LoraSettings
from pipeline.wiki.config import WikiConfig

RL_FORMATS = ("react", "act")  # the interactive loops: one policy turn per environment step


@dataclass
class RewardSettings:
    """Weights of the reward's terms (their weighted sum is the reward; each is logged)."""

    em: float = 1.0  # exact match of the Finish[...] answer with the gold answer (the task's metric)
    f1: float = 0.0  # token F1 of the answer with the gold answer
    format: float = 0.0  # 1 when the episode ended with Finish[...] (any answer), else 0


@dataclass
class RolloutSettings:
    """Who generates the rollouts. transformers: the trainer's own model (CPU or GPU).
    vllm: TRL's vLLM engine, colocated on the training GPUs or a `trl vllm-serve` server
    (GPUs only; not run here)."""

    engine: Literal["transformers", "vllm"] = "transformers"
    max_batch_size: int = at_least(1, default=16)  # transformers: sequences per decoding batch
    max_context: int | None = at_least(1, default=None)  # tokens; None = the model's own limit (longer episodes end context_exceeded)
    vllm_mode: Literal["colocate", "server"] = "colocate"  # TRL's vllm_mode
    vllm_server_base_url: str | None = None  # server mode: the `trl vllm-serve` URL (TRL's vllm_server_base_url)
    vllm_gpu_memory_utilization: float = 0.3  # colocate mode: the GPU share vLLM takes beside training
    vllm_tensor_parallel_size: int = at_least(1, default=1)  # colocate mode
    vllm_extra: dict = field(default_factory=dict)  # other GRPOConfig vllm_* keys, passed as they are


@dataclass
class RolloutPrompting(MethodSettings):
    """How the rollouts prompt: the method settings `eval` uses, with GRPO's defaults."""

    style: str = "zero_shot"  # the question line alone, as `eval` prompts a fine-tuned student (the only style here)
    max_new_tokens: int = at_least(1, default=100)  # per step (the original ReAct code's cap)
    temperature: float = 1.0  # samples the rollouts (> 0); the loss's log-probabilities use it too


@dataclass
class GrpoConfig:
    experiment: str = "default"
    # where the policy starts: a base model (hub id, folder, "smollm2"), a `final/` of ours, or a
    # released fine-tuned model (a full model or a PEFT adapter, folder or hub id; pipeline/hub/released.py)
    student: str = "smollm2"
    student_name: str | None = None  # folder label; default: <the start's label>-grpo
    base_model: str | None = None  # the base of an adapter `student` (default: its manifest / adapter_config.json)
    tokenizer: str | None = None  # default: the start's own
    trust_remote_code: bool = False
    size_class: str | None = None  # e.g. 135m, 8b; default: the start's (its manifest, the registry, its config)
    format: str = "react"  # react | act: the loop the policy acts in (a fine-tuned start must have learned it)
    questions: str = "offline-bootstrap"  # training questions (a question set or file); eval's stay apart
    limit: int | None = at_least(1, default=None)
    wiki: WikiConfig = field(default_factory=WikiConfig)
    prompting: RolloutPrompting = field(default_factory=RolloutPrompting)  # max_steps (7 on HotpotQA), max_new_tokens, loop, temperature
    reward: RewardSettings = field(default_factory=RewardSettings)
    group_size: int = at_least(2, "GRPO compares the rollouts of one question", default=8)  # rollouts per question (TRL num_generations): the group its advantages compare
    questions_per_step: int = at_least(1, default=8)  # questions per optimizer step; rollouts per step = questions_per_step x group_size
    per_device_batch_size: int | None = at_least(1, default=None)  # rollouts per forward/backward; default: largest divisor <= max_per_device_batch_size
    max_per_device_batch_size: int = at_least(1, default=8)
    max_steps: int = at_least(1, default=100)
    learning_rate: float = 1e-6
    lr_scheduler: str = "constant"
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch"
    beta: float = 0.0  # KL coefficient to the start (0: no reference model, TRL's default)
    epsilon: float = 0.2  # PPO clip range
    loss_type: str = "dapo"  # TRL's loss_type (dapo: tokens normalised over the accumulated batch)
    scale_rewards: str = "group"  # group | batch | none (TRL's scale_rewards)
    num_iterations: int = at_least(1, default=1)  # optimisation passes per batch of rollouts (GRPO's mu)
    finetuning: Literal["full", "lora"] = "full"  # lora: a new adapter on a full start, or the start's own adapter trained on
    lora: LoraSettings = field(default_factory=LoraSettings)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on a bf16 GPU or CPU, else fp32
    attn_implementation: str | None = "auto"
    gradient_checkpointing: bool = False
    peak_tflops: float | None = None  # per device, for MFU; default: the GPU's from pipeline/train/flops.py's table
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    output_root: Path = Path("checkpoints")
    output_dir: Path | None = None  # default: <output_root>/<experiment>/<student_name>/<format>
    accelerate_config: str = "auto"  # auto | cpu | cpu_ddp | multi_gpu | deepspeed_zero2 | ... | a path
    num_processes: int | None = at_least(1, default=None)  # override the accelerate config's process count
    deepspeed_on_cpu: bool = False  # true: run a deepspeed_* accelerate config on CPU processes on purpose (tests; fp32 only)
    save_steps: int = at_least(1, default=50)
    save_total_limit: int | None = at_least(1, default=3)
    keep_checkpoints: bool = True  # false: delete checkpoint-*/ once final/ is complete
    logging_steps: int = at_least(1, default=1)
    report_to: str = "none"  # tensorboard: event files under <output_dir>/runs
    log_rollouts: bool = True  # every rollout's record, per step: <output_dir>/rollouts/step-N.rank-R.jsonl
    seed: int = at_least(0, default=0)  # also seeds every rollout's sampling (by step and place), so a resume re-samples the same
    resume: str = "latest"  # latest (complete checkpoint, if any) | none | a checkpoint path

    @property
    def rollouts_per_step(self) -> int:
        return self.questions_per_step * self.group_size


def resolve(cfg: GrpoConfig) -> GrpoConfig:
    """Check values and fill the defaults that depend on other keys; the start's label comes
    from the start itself (pipeline.rl.start), so a final/ of ours names its GRPO heir."""
    from pipeline.rl.start import start_label

    if cfg.format not in RL_FORMATS:
        raise PipelineError(f"format: GRPO runs the interactive loops {', '.join(RL_FORMATS)}, not '{cfg.format}'")
    if cfg.prompting.style != "zero_shot":
        raise PipelineError(f"prompting.style: GRPO trains zero-shot (the question line alone), as `eval` decodes "
                            f"a fine-tuned student; got '{cfg.prompting.style}'")
    if cfg.prompting.temperature <= 0:
        raise PipelineError(f"prompting.temperature: GRPO samples its rollouts (a group of greedy rollouts is one "
                            f"rollout {cfg.group_size} times, with no advantage to learn from); set it > 0, e.g. 1.0")
    for key in ("group_size", "questions_per_step", "max_steps", "save_steps", "logging_steps"):
        if getattr(cfg, key) < (2 if key == "group_size" else 1):
            raise PipelineError(f"{key} must be >= {2 if key == 'group_size' else 1}, got {getattr(cfg, key)}"
                                + (" (GRPO compares the rollouts of one question)" if key == "group_size" else ""))
    if cfg.prompting.max_steps < 1 or cfg.prompting.max_new_tokens < 1:
        raise PipelineError("prompting.max_steps and prompting.max_new_tokens must be >= 1")
    if min(cfg.reward.em, cfg.reward.f1, cfg.reward.format) < 0 or not (cfg.reward.em or cfg.reward.f1 or cfg.reward.format):
        raise PipelineError("reward: the weights (em, f1, format) must be >= 0 and not all 0")
    if cfg.rollout.engine == "vllm" and cfg.rollout.vllm_mode == "server" and not cfg.rollout.vllm_server_base_url:
        raise PipelineError("rollout.vllm_server_base_url: server mode needs the `trl vllm-serve` URL, "
                            "e.g. http://gpu01:8000")
    if cfg.student_name is None:
        cfg.student_name = f"{start_label(cfg.student)}-grpo"
    if cfg.output_dir is None:
        cfg.output_dir = cfg.output_root / cfg.experiment / cfg.student_name / cfg.format
    return cfg
