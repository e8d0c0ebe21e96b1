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
from typing import ClassVar, Literal

from pipeline.core.config import at_least, checked, folder_name, http_url, in_range
from pipeline.core.errors import PipelineError
from pipeline.methods import MethodSettings
from pipeline.rl.heldout import HeldoutSettings
from pipeline.train.config import LoraSettings
from pipeline.train.settings import (
    check_loss_type,
    check_optim,
    check_report_to,
    check_scale_rewards,
    check_scheduler,
    trl_synonyms,
)
from pipeline.wiki.config import WikiConfig

RL_FORMATS = ("react", "act")  # the interactive loops: one policy turn per environment step


@dataclass
class RewardSettings:
    """Weights of the reward's terms (their weighted sum is the reward; each is logged)."""

    em: float = checked(in_range(0), default=1.0)  # the task's correctness of the Finish[...] answer: HotpotQA's exact match, FEVER's accuracy
    f1: float = checked(in_range(0), default=0.0)  # the task's partial credit: HotpotQA's token F1 (FEVER's is its accuracy: no partial credit)
    format: float = checked(in_range(0), default=0.0)  # 1 when the episode ended with Finish[...] (any answer), else 0


@dataclass
class RolloutSettings:
    """Who generates the rollouts. transformers: the trainer's own model (CPU or GPU).
    vllm: TRL's vLLM engine, colocated on the training GPUs or a `trl vllm-serve` server
    (GPUs only; not run here)."""

    engine: Literal["transformers", "vllm"] = "transformers"
    max_batch_size: int = at_least(1, default=16)  # transformers: sequences per decoding batch (a step's rollouts, the held-out questions)
    # transformers: the weights it samples from. auto: the training's precision (bf16 mixed precision: a bf16 copy
    # of the fp32 weights, cast once per rollout batch); fp32: the fp32 master weights (the GRPO runs before that)
    precision: Literal["auto", "fp32"] = "auto"
    # tokens an episode may reach; None = the model's own limit (longer episodes end context_exceeded). vLLM
    # colocated needs it (its vllm_max_model_length): it reserves KV cache for one sequence of this length.
    max_context: int | None = at_least(1, default=None)
    vllm_mode: Literal["colocate", "server"] = "colocate"  # TRL's vllm_mode
    vllm_server_base_url: str | None = checked(http_url, default=None)  # server mode: the `trl vllm-serve` URL (TRL's vllm_server_base_url)
    vllm_gpu_memory_utilization: float = checked(in_range(0, 1, above=True), default=0.3)  # colocate mode: the GPU share vLLM takes beside training
    # colocate mode; only 1 (each process's own episodes go to its own engine)
    vllm_tensor_parallel_size: int = at_least(1, default=1)
    vllm_extra: dict = field(default_factory=dict)  # other GRPOConfig vllm_* keys, passed as they are


@dataclass
class RolloutPrompting(MethodSettings):
    """How the rollouts prompt: the method settings `eval` uses, with GRPO's defaults."""

    style: str = "zero_shot"  # the question line alone, as `eval` prompts a fine-tuned student (the only style here)
    max_new_tokens: int = at_least(1, default=100)  # per step (the original ReAct code's cap)
    # samples the rollouts; the loss's log-probabilities use it too. The bound is >= 0 so that 0 reaches
    # resolve()'s refusal, which says why GRPO needs > 0 (a greedy group has no advantage to learn from)
    temperature: float = checked(in_range(0), default=1.0)


@dataclass
class GrpoConfig:
    # TRL GRPOConfig's (and its scripts') names of our keys: their did-you-mean (pipeline.core.config)
    SYNONYMS: ClassVar[dict[str, tuple[str, str]]] = trl_synonyms({
        "num_generations": "group_size", "max_completion_length": "prompting.max_new_tokens",
        "temperature": "prompting.temperature", "use_vllm": "rollout.engine", "vllm_mode": "rollout.vllm_mode",
        "vllm_gpu_memory_utilization": "rollout.vllm_gpu_memory_utilization", "reward_weights": "reward",
        "dataset_name": "questions"})

    experiment: str = checked(folder_name, default="default")  # a folder under output_root
    # where the policy starts: a base model (hub id, folder, "smollm2"), a `final/` of ours, or a
    # released fine-tuned model (a full model or a PEFT adapter, folder or hub id; pipeline/hub/released.py)
    student: str = "smollm2"
    student_name: str | None = checked(folder_name, default=None)  # folder label; default: <the start's label>-grpo
    base_model: str | None = None  # the base of an adapter `student` (default: its manifest / adapter_config.json)
    tokenizer: str | None = None  # default: the start's own
    trust_remote_code: bool = False
    size_class: str | None = None  # e.g. 135m, 8b; default: the start's (its manifest, the registry, its config)
    format: str = "react"  # react | act: the loop the policy acts in (a fine-tuned start must have learned it)
    task: str = "hotpotqa"  # hotpotqa | fever (pipeline.tasks): the training questions, the question line, the reward's metric
    questions: str = "offline-bootstrap"  # training questions: a question set of the task, or a file; eval's stay apart
    limit: int | None = at_least(1, default=None)
    wiki: WikiConfig = field(default_factory=WikiConfig)
    prompting: RolloutPrompting = field(default_factory=RolloutPrompting)  # max_steps (7 on HotpotQA), max_new_tokens, loop, temperature
    reward: RewardSettings = field(default_factory=RewardSettings)
    group_size: int = at_least(2, "GRPO compares the rollouts of one question", default=8)  # rollouts per question (TRL num_generations): the group its advantages compare
    questions_per_step: int = at_least(1, default=8)  # questions per optimizer step; rollouts per step = questions_per_step x group_size
    per_device_batch_size: int | None = at_least(1, default=None)  # rollouts per forward/backward; default: largest divisor <= max_per_device_batch_size
    max_per_device_batch_size: int = at_least(1, default=8)
    max_steps: int = at_least(1, default=100)
    learning_rate: float = checked(in_range(0, above=True), default=1e-6)
    lr_scheduler: str = checked(check_scheduler, default="constant")  # transformers' SchedulerType
    warmup_ratio: float = checked(in_range(0, 1), default=0.0)  # a share of max_steps
    weight_decay: float = checked(in_range(0), default=0.0)
    max_grad_norm: float = checked(in_range(0), default=1.0)  # 0: no clipping
    optim: str = checked(check_optim, default="adamw_torch")  # transformers' OptimizerNames
    beta: float = checked(in_range(0), default=0.0)  # KL coefficient to the start (0: no reference model, TRL's default)
    epsilon: float = checked(in_range(0, above=True), default=0.2)  # PPO clip range
    loss_type: str = checked(check_loss_type, default="dapo")  # TRL's loss_type (dapo: tokens normalised over the accumulated batch)
    scale_rewards: str = checked(check_scale_rewards, default="group")  # group | batch | none (TRL's scale_rewards)
    num_iterations: int = at_least(1, default=1)  # optimisation passes per batch of rollouts (GRPO's mu)
    finetuning: Literal["full", "lora"] = "full"  # lora: a new adapter on a full start, or the start's own adapter trained on
    lora: LoraSettings = field(default_factory=LoraSettings)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on a bf16 GPU or CPU, else fp32
    attn_implementation: str | None = "auto"
    gradient_checkpointing: bool = False
    peak_tflops: float | None = checked(in_range(0, above=True), default=None)  # per device, for MFU; default: the GPU's from pipeline/train/flops.py's table
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    heldout: HeldoutSettings = field(default_factory=HeldoutSettings)  # a held-out EM curve while training (off: every 0)
    allow_question_overlap: bool = False  # true: a held-out set that shares questions with `questions` is meant
    output_root: Path = Path("checkpoints")
    output_dir: Path | None = None  # default: <output_root>/<experiment>/<student_name>/<format>
    accelerate_config: str = "auto"  # auto | cpu | cpu_ddp | multi_gpu | deepspeed_zero2 | ... | a path
    num_processes: int | None = at_least(1, default=None)  # override the accelerate config's process count
    deepspeed_on_cpu: bool = False  # true: run a deepspeed_* accelerate config on CPU processes on purpose (tests; fp32 only)
    save_steps: int = at_least(1, default=50)
    save_total_limit: int | None = at_least(1, default=3)
    keep_checkpoints: bool = True  # false: delete checkpoint-*/ once final/ is complete
    logging_steps: int = at_least(1, default=1)
    report_to: str = checked(check_report_to, default="none")  # tensorboard: event files under <output_dir>/runs
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
    from pipeline.tasks import get_task

    get_task(cfg.task)  # an unknown task: one line naming the known ones
    if cfg.format not in RL_FORMATS:
        raise PipelineError(f"format: GRPO runs the interactive loops {', '.join(RL_FORMATS)}, not '{cfg.format}'")
    if cfg.prompting.style != "zero_shot":
        raise PipelineError(f"prompting.style: GRPO trains zero-shot (the question line alone), as `eval` decodes "
                            f"a fine-tuned student; got '{cfg.prompting.style}'")
    if cfg.prompting.interface != "text":
        raise PipelineError(f"prompting.interface: GRPO's rollouts decode the text layout; "
                            f"'{cfg.prompting.interface}' is eval's and generate's only (remove the key)")
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
    check_vllm_rollout(cfg.rollout)
    if cfg.student_name is None:
        cfg.student_name = f"{start_label(cfg.student)}-grpo"
    if cfg.output_dir is None:
        cfg.output_dir = cfg.output_root / cfg.experiment / cfg.student_name / cfg.format
    return cfg


def check_heldout_apart(cfg: GrpoConfig) -> None:
    """A held-out curve over the training questions would show the policy's recall of them, not
    how it generalises: refused unless allow_question_overlap (pipeline.tasks.overlap)."""
    from pipeline.tasks import get_task
    from pipeline.tasks.overlap import check_apart

    if cfg.heldout.every:
        check_apart(get_task(cfg.task), (cfg.questions, cfg.limit), (cfg.heldout.questions, cfg.heldout.limit),
                    "heldout.questions", cfg.allow_question_overlap)


def check_vllm_rollout(r: RolloutSettings) -> None:
    """What TRL's colocated vLLM engine needs from the project's rollout loop."""
    if r.engine != "vllm" or r.vllm_mode != "colocate":
        return
    if r.max_context is None and "vllm_max_model_length" not in r.vllm_extra:
        # vLLM sizes its context from the model's config (131,072 tokens for Llama-3.1) and refuses to start when
        # one such sequence's KV cache does not fit in its vllm_gpu_memory_utilization share.
        raise PipelineError("rollout.max_context: colocated vLLM needs the episode's token budget (its "
                            "vllm_max_model_length; otherwise the model's whole context, which a 0.3 GPU share "
                            "cannot hold); set it to the question line + prompting.max_steps x (max_new_tokens "
                            "+ an observation), e.g. rollout.max_context=4096")
    if r.vllm_tensor_parallel_size > 1:
        # Every rank of one tensor-parallel engine must submit the same batch: TRL gathers its own prompts over
        # the TP group first; this loop's rounds differ per rank (episodes end at different steps), so it cannot.
        raise PipelineError(f"rollout.vllm_tensor_parallel_size={r.vllm_tensor_parallel_size}: the rollout loop "
                            "sends each process's own episodes to its colocated engine, which tensor parallelism "
                            "cannot take; use 1 (one engine per GPU) or vllm_mode=server with a tensor-parallel "
                            "`trl vllm-serve`")


def check_rollout_strategy(engine: str, strategy: str) -> None:
    """The transformers engine decodes with the trainer's own model, rank by rank: under FSDP each
    forward all-gathers the shards, and ranks whose episodes decode different numbers of tokens stop
    meeting in those all-gathers (a hang; transformers' generate() avoids it with synced_gpus, the
    project's loop cannot). DeepSpeed ZeRO-3 gathers the whole policy once per rollout batch instead."""
    if engine == "transformers" and strategy == "fsdp":
        raise PipelineError("rollout.engine=transformers cannot run under FSDP (ranks decoding different lengths "
                            "would stop meeting in FSDP's all-gathers and hang); use a deepspeed_zero3 "
                            "accelerate_config, or rollout.engine=vllm")


# What a GRPO launch imports beside vLLM when it runs in the vLLM environment (the project's own
# dependencies; DeepSpeed where its accelerate config asks for it).
LAUNCH_MODULES = ("accelerate", "trl", "peft", "datasets")


def rollout_python(engine: str, distributed_type: str | None) -> str:
    """The interpreter a GRPO launch runs in: this one, unless its rollouts need vLLM and vLLM
    does not import here; then the vLLM environment's (pipeline/llm/interpreter.py), which must
    hold what the launch imports too, DeepSpeed where the accelerate config asks for it. A
    refusal is one line, before anything is launched."""
    import sys

    if engine != "vllm":
        return sys.executable
    from pipeline.llm.interpreter import python_for

    needs = LAUNCH_MODULES + (("deepspeed",) if distributed_type == "DEEPSPEED" else ())
    return python_for("rollout.engine=vllm", needs)


def check_vllm_installed(engine: str) -> None:
    """TRL's vLLM engine runs in the launched processes, which are this interpreter: without vLLM
    here, TRL's GRPOTrainer raises its ImportError only after the policy has loaded (minutes for
    an 8B). vLLM is found as TRL finds it (import_utils.is_vllm_available: importlib's find_spec).
    The remedy is the project's vLLM environment, not vLLM in this one: vLLM 0.32 pins
    transformers < 5.20 and pip would replace this venv's without a word."""
    import importlib.util
    import sys

    from pipeline.llm.serving import VLLM_VENV

    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise PipelineError(f"rollout.engine=vllm: vLLM is not installed for {sys.executable}; run the same command "
                            f"with {VLLM_VENV / 'bin' / 'python'} -m pipeline ... (bash scripts/setup_vllm.sh makes it, "
                            "with TRL, PEFT, accelerate and this project; do not install vLLM into this venv: it "
                            "pins an older transformers), or set rollout.engine=transformers")
