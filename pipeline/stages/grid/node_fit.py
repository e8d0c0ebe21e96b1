"""Whether the grid's target node (its `node:`: GPUs and each one's memory) can hold every unit,
judged on the grid as the user wrote it, before `run --rehearse` substitutes anything:
- every model served or loaded with vLLM (a teacher, an eval's server, GRPO's rollout engine):
  its tensor parallel size at most the node's GPUs;
- every training and GRPO launch: its peak memory per GPU (pipeline/train/memory.py) at most the
  GPU's memory, said beside it in the plan, refused with the numbers and the one setting that
  would make it fit.
A model whose sizes are unknown here (not on disk, not in the table of known families) is said,
not estimated."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.config import read_yaml
from pipeline.core.errors import PipelineError
from pipeline.stages.eval import EvalConfig
from pipeline.stages.generate import GenerateConfig
from pipeline.stages.grid.unit import Unit
from pipeline.stages.grpo import GrpoConfig
from pipeline.train import launcher, memory
from pipeline.train.config import FinetuneConfig
from pipeline.train.sft import split_batch

# A trajectory's length where the config does not bound it (max_length / max_context unset): the
# paper grid's ReAct episodes of 7 steps of 100 new tokens with up-to-5-sentence observations
# stay under it; set max_length to bound it and the estimate follows.
ASSUMED_TOKENS = 2048
STRATEGIES = {"deepspeed_zero2": "zero2", "deepspeed_zero3": "zero3", "deepspeed_zero3_offload": "zero3_offload",
              "fsdp": "fsdp"}


@dataclass
class Fit:
    """Per unit title, what the target node's launch is and what it holds; the refusals found."""

    needs: dict[str, str] = field(default_factory=dict)
    refusals: dict[str, list[str]] = field(default_factory=dict)  # what is refused -> the units it is refused for

    def refuse(self, unit: Unit, text: str) -> None:
        self.refusals.setdefault(text, []).append(unit.title)


def check_node(node, units: list[Unit]) -> Fit:
    """Every unit of the grid's own plan against `node` (a TargetNode); raises PipelineError with
    every unit the node cannot hold, one line each (the first on the first line)."""
    fit = Fit()
    finals = {str(Path(u.config.output_dir) / "final"): u.config.student
              for u in units if isinstance(u.config, FinetuneConfig)}
    for unit in units:
        config = unit.config
        if isinstance(config, GenerateConfig) and config.oracle is None:
            tensor_parallel(fit, unit, config.teacher, node, "generate.teacher.tensor_parallel_size")
        elif isinstance(config, EvalConfig) and config.oracle is None:
            tensor_parallel(fit, unit, config.model, node, "model.tensor_parallel_size")
        elif isinstance(config, FinetuneConfig):
            training(fit, unit, config, node, config.student)
        elif isinstance(config, GrpoConfig):
            if config.rollout.engine == "vllm" and config.rollout.vllm_tensor_parallel_size > node.gpus:
                fit.refuse(unit, "rollout.vllm_tensor_parallel_size "
                                    f"{config.rollout.vllm_tensor_parallel_size} > the node's {node.gpus} GPUs; set it "
                                    f"to at most {node.gpus}")
            training(fit, unit, config, node, finals.get(str(config.student)) or config.base_model or config.student)
    if fit.refusals:
        units_said = [f"{', '.join(titles)}: {text}" for text, titles in fit.refusals.items()]
        raise PipelineError(f"the grid's `node:` ({node.gpus} x {node.gpu_mib} MiB) cannot hold "
                            f"{sum(map(len, fit.refusals.values()))} unit(s): " + " | ".join(units_said))
    return fit


def tensor_parallel(fit: Fit, unit: Unit, llm, node, key: str) -> None:
    """A vLLM model (in-process or a `serve:` the unit starts) splits over tensor_parallel_size GPUs."""
    if llm.backend == "openai":  # the user's own server (the rehearsal plans it on the node's GPUs)
        return
    if llm.backend == "vllm" or getattr(unit.config, "serve", None) is not None:
        if llm.tensor_parallel_size > node.gpus:
            fit.refuse(unit, f"{key} {llm.tensor_parallel_size} > the node's {node.gpus} GPUs; set it to at most "
                                f"{node.gpus} (the model's weights over {node.gpus} GPUs must still fit their share)")


def shape_for(model: str | None) -> memory.Shape | None:
    """The sizes of a model: its config.json on disk (an embedded model's too), else the table."""
    from pipeline.hub.models import EMBEDDED, resolve_model_path

    if not model:
        return None
    try:
        path = Path(resolve_model_path(model)) if model in EMBEDDED else Path(model).expanduser()
    except PipelineError:
        path = None
    if path is not None and (path / "config.json").is_file():
        try:
            return memory.shape_of(json.loads((path / "config.json").read_text(encoding="utf-8")))
        except (KeyError, TypeError, ValueError):
            return None
    name = {"smollm2": "huggingfacetb/smollm2-135m", "gemma3-270m": "google/gemma-3-270m"}.get(model, model.lower())
    for suffix in ("-fp8", "-instruct"):
        name = name.removesuffix(suffix)
    return memory.KNOWN_SHAPES.get(name)


def strategy_of(config_path: Path) -> str:
    """zero2 | zero3 | zero3_offload | fsdp | ddp, from an accelerate config (its DeepSpeed JSON's stage)."""
    if config_path.stem in STRATEGIES:
        return STRATEGIES[config_path.stem]
    data = read_yaml(config_path)
    kind = data.get("distributed_type")
    if kind == "FSDP":
        return "fsdp"
    if kind != "DEEPSPEED":
        return "ddp"
    ds = data.get("deepspeed_config") or {}
    stage, offload = ds.get("zero_stage"), ds.get("offload_param_device") not in (None, "none")
    if ds.get("deepspeed_config_file"):
        zero = json.loads(Path(ds["deepspeed_config_file"]).read_text()).get("zero_optimization") or {}
        stage = zero.get("stage", stage)
        offload = (zero.get("offload_param") or {}).get("device") not in (None, "none")
    return "zero3_offload" if stage == 3 and offload else "zero3" if stage == 3 else "zero2"


def training(fit: Fit, unit: Unit, config, node, model: str | None) -> None:
    """A train or grpo launch on the node: its processes, its estimate beside the GPU's memory."""
    try:
        world = launcher.launch_world(config.accelerate_config, config.num_processes, node.gpus)
        where = f"{world.processes} process{'es' if world.processes > 1 else ''} of {world.config.stem}"
        shape = shape_for(model)
        launch, said = launch_of(config, shape, world, node) if shape is not None else (None, "")
    except PipelineError as exc:  # more processes than the node's GPUs, a batch that does not divide over them
        fit.refuse(unit, str(exc))
        return
    if read_yaml(world.config).get("use_cpu"):  # a CPU launch (cpu, cpu_ddp) holds none of the node's GPUs
        fit.needs[unit.title] = f"{where}: on the CPU, none of the node's GPUs"
        return
    if shape is None:
        fit.needs[unit.title] = f"{where}; memory not estimated ({model}: its sizes are unknown here: no config.json " \
                                "on disk, not in pipeline/train/memory.py's table)"
        return
    est = memory.estimate(launch)
    limit = node.gpu_mib * 2**20
    verdict = "fits" if est.total <= limit else "does NOT fit"
    fit.needs[unit.title] = (f"{where}: {memory.describe(est, launch.extra_what)} per GPU of the node's "
                             f"{memory.gib(limit)} GiB: {verdict}{said}")
    if est.total > limit:
        fit.refuse(unit, f"{where} need {memory.describe(est, launch.extra_what)} per GPU{said}, more than the "
                         f"GPU's {memory.gib(limit)} GiB ({node.gpu_mib} MiB); "
                         f"{memory.what_fits(launch, limit, qlora=not isinstance(config, GrpoConfig))}")


def launch_of(config, shape: memory.Shape, world, node) -> tuple[memory.Launch, str]:
    """The memory-relevant settings of a train or grpo config on the node, and what was assumed."""
    grpo = isinstance(config, GrpoConfig)
    if grpo:
        rollouts = config.questions_per_step * config.group_size
        micro, _ = split_batch(rollouts, world.processes, config.per_device_batch_size, config.max_per_device_batch_size,
                               batch_name="questions_per_step x group_size")
        length, chunked = config.rollout.max_context, False  # TRL's GRPO takes the completions' logits whole
    else:
        micro, _ = split_batch(config.global_batch_size, world.processes, config.per_device_batch_size,
                               config.max_per_device_batch_size)
        length, chunked = config.max_length, config.loss != "model"  # auto: TRL's chunked loss on GPUs
    said = "" if length else f" (length unset: {ASSUMED_TOKENS} tokens per sequence assumed; set " \
                             f"{'rollout.max_context' if grpo else 'max_length'} to bound it)"
    strategy = strategy_of(world.config)
    launch = memory.Launch(shape, strategy, world.processes, config.finetuning, config.lora.r,
                           tuple(config.lora.target_modules), micro, length or ASSUMED_TOKENS,
                           config.gradient_checkpointing, chunked, config.precision != "fp32")
    if grpo:
        extra, what = 0, []
        if config.beta > 0:  # the reference model's 16-bit weights, sharded as the policy's
            extra += int(2 * shape.params / (world.processes if strategy in ("zero3", "fsdp") else 1))
            what.append("reference model")
        if config.rollout.engine == "vllm" and config.rollout.vllm_mode == "colocate":
            extra += int(config.rollout.vllm_gpu_memory_utilization * node.gpu_mib * 2**20)
            what.append(f"vLLM's colocated {config.rollout.vllm_gpu_memory_utilization:g} share")
        launch = memory.Launch(**{**launch.__dict__, "extra_bytes": extra, "extra_what": " and ".join(what)})
    return launch, said
