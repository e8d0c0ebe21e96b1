"""The DeepSpeed side of a training launch, as `accelerate launch` hands it to the processes:
which DeepSpeed JSON (and ZeRO stage) the accelerate config names, the refusal of a DeepSpeed
launch that sees no GPU, and what DeepSpeed ran with, for the manifest.

The shipped DeepSpeed YAMLs (accelerate_configs/deepspeed_*.yaml) name a JSON beside them,
because an accelerate YAML cannot say `data_types.grad_accum_dtype`: without it DeepSpeed
accumulates a step's micro-batch gradients in the model dtype (bf16; deepspeed/runtime/engine.py
get_data_types), and the JSONs say fp32.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.train.launch import Launch

# Shipped inside the package (pipeline/accelerate_configs links to the repository's
# accelerate_configs/), so a non-editable install finds them too.
ACCELERATE_CONFIGS = Path(str(resources.files("pipeline") / "accelerate_configs"))


def check_deepspeed_device(deepspeed: bool, cuda: bool, on_cpu: bool, processes: int) -> None:
    """A DeepSpeed launch that sees no CUDA device (a job step without its GPUs, a wrong
    CUDA_VISIBLE_DEVICES) runs its processes on the CPU in fp32 without a word: refuse it, as
    FSDP on CPU is, unless `deepspeed_on_cpu` asks for exactly that. The `train` stage checks
    it before launching, the launched processes again (a direct `accelerate launch`)."""
    if not deepspeed or cuda or on_cpu:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = "CUDA_VISIBLE_DEVICES is unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible!r}"
    raise PipelineError(f"the accelerate config says DeepSpeed, but this launch sees no CUDA device ({seen}): its "
                        f"{processes} process(es) would train on the CPU in fp32; run it where its GPUs are visible, "
                        "or set deepspeed_on_cpu=true to run ZeRO on CPU on purpose")


DEEPSPEED_CONFIG_ENV = "ACCELERATE_DEEPSPEED_CONFIG_FILE"  # accelerate launch: the YAML's deepspeed_config_file


def settle_deepspeed_config(env: dict | None = None) -> tuple[Path, dict] | None:
    """(path, contents) of the DeepSpeed JSON this launch names, or None (not DeepSpeed, or an
    accelerate YAML without a deepspeed_config_file). Settled in `env` before accelerate reads
    it: a relative path that does not exist from the working directory (accelerate reads it from
    there) is taken beside the shipped accelerate configs, whose YAMLs name
    `accelerate_configs/<name>.json` (right from the repository root only), and the absolute path
    is written back; the file's ZeRO stage is exported as ACCELERATE_DEEPSPEED_ZERO_STAGE where
    the launcher set none (a YAML with a config file says no zero_stage; launch_strategy reads it)."""
    import json
    env = os.environ if env is None else env
    named = env.get(DEEPSPEED_CONFIG_ENV, "none")
    if not Launch.from_env(env).deepspeed or named == "none":
        return None
    path = Path(named)
    if not path.is_absolute() and not path.is_file():
        if (ACCELERATE_CONFIGS / path.name).is_file():
            path = ACCELERATE_CONFIGS / path.name
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PipelineError(f"deepspeed_config_file: cannot read {path} ({exc}); fix the path in the accelerate "
                            "config (a relative path is read from the working directory)") from None
    env[DEEPSPEED_CONFIG_ENV] = str(path.resolve())
    stage = (config.get("zero_optimization") or {}).get("stage")
    if isinstance(stage, int):
        env.setdefault("ACCELERATE_DEEPSPEED_ZERO_STAGE", str(stage))
    return path.resolve(), config


def deepspeed_line(path: Path, config: dict) -> str:
    accum = (config.get("data_types") or {}).get("grad_accum_dtype")
    how = (f"gradients accumulate over micro-batches in {accum} (data_types.grad_accum_dtype)" if accum else
           "gradients accumulate in the model dtype (no data_types.grad_accum_dtype: bf16 when training in bf16)")
    return f"[finetune] DeepSpeed ZeRO-{(config.get('zero_optimization') or {}).get('stage')} from {path}: {how}"


def deepspeed_record(trainer) -> dict | None:
    """For the manifest: what DeepSpeed ran with, from the config as resolved for this run (the
    "auto" values filled in by accelerate and the Trainer) and from the engine itself."""
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return None
    config = plugin.deepspeed_config
    engine = trainer.model_wrapped  # the DeepSpeedEngine once training has started
    model_dtype, accum_dtype = engine.get_data_types()
    return {"config_file": os.environ.get(DEEPSPEED_CONFIG_ENV), "zero_stage": config["zero_optimization"]["stage"],
            "bf16": bool((config.get("bf16") or {}).get("enabled")), "data_types": dict(config.get("data_types") or {}),
            "engine_model_dtype": str(model_dtype).removeprefix("torch."),
            "engine_grad_accum_dtype": str(accum_dtype).removeprefix("torch.")}
