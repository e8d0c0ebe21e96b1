"""The names `train` and `grpo` hand to transformers and TRL, checked when the config is built
(pipeline.core.config `checked` fields), against the libraries' own lists where they have one: a
typo in `optim`, `lr_scheduler`, `report_to` or `loss_type` is one line from `--dry-run` and
`run --print-config`, not a traceback after the model loaded (or, for `loss_type`, after a step of
rollouts). The lists are read from the installed library when a value is given, so the configs'
modules import no library and an upgrade's new names are accepted. transformers' two enumerations
are read from its source files, not imported: their modules import torch and PEFT, 3-5 s of CPU in
every `train`, `grpo` and `run` process (most of a `--dry-run`), spent on a name check.

    transformers  OptimizerNames (training_args.py), SchedulerType (trainer_utils.py), the
                  report_to integrations and which are installed (integrations/integration_utils.py)
    TRL           GRPOConfig.loss_type and scale_rewards: no enumeration in TRL; the values its
                  GRPOTrainer branches on (trl/trainer/grpo_trainer.py `Unknown loss type`,
                  `Invalid value for scale_rewards`), which tests/test_preflight.py reads back from
                  the installed source
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import Any

from pipeline.core.config import one_of

# TRL's names (its SFTConfig's and GRPOConfig's, and its scripts' ModelConfig's) of keys `train` and
# `grpo` share, for their did-you-mean (pipeline.core.config `SYNONYMS`); each config adds its own
TRL_SHARED_NAMES = {
    "per_device_train_batch_size": "per_device_batch_size", "lr_scheduler_type": "lr_scheduler",
    "model_name_or_path": "student", "use_peft": "finetuning", "lora_r": "lora.r", "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout", "lora_target_modules": "lora.target_modules", "bf16": "precision",
    "fp16": "precision"}


def trl_synonyms(own: dict[str, str]) -> dict[str, tuple[str, str]]:
    """A config's SYNONYMS: TRL's shared names and its own, each said to be TRL's."""
    return {name: (ours, "TRL's") for name, ours in {**TRL_SHARED_NAMES, **own}.items()}


# TRL's GRPOConfig.loss_type values (its help and GRPOTrainer's branches) and scale_rewards values
GRPO_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
NO_REPORTING = "none"  # ours: report_to=none hands transformers an empty list


@functools.cache
def enum_values(module: str, name: str) -> tuple[str, ...]:
    """The values of the string enumeration `name` (class NAME(ExplicitEnum): A = "a", ...) in the
    installed `module`'s source file, read without importing the module. Anything but `A = "a"`
    lines in the class raises: a library that builds its names another way must be read another way."""
    package, *parts = module.split(".")
    spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {package!r}", name=package)
    path = Path(spec.submodule_search_locations[0], *parts).with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            members = [stmt for stmt in node.body if isinstance(stmt, ast.Assign | ast.AnnAssign)]
            values = [stmt.value.value for stmt in members
                      if isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)]
            if values and len(values) == len(members):
                return tuple(values)
            raise RuntimeError(f"{path}: {name} is not a list of NAME = \"value\" lines; read its names another way")
    raise RuntimeError(f"{path} defines no class {name}")


def optimizer_names() -> tuple[str, ...]:
    return enum_values("transformers.training_args", "OptimizerNames")


def scheduler_names() -> tuple[str, ...]:
    return enum_values("transformers.trainer_utils", "SchedulerType")


check_optim = one_of(optimizer_names, "transformers' optimizers (OptimizerNames)")
check_scheduler = one_of(scheduler_names, "transformers' schedulers (SchedulerType)")
check_loss_type = one_of(GRPO_LOSS_TYPES, "TRL's GRPO loss types")
check_scale_rewards = one_of(SCALE_REWARDS, "TRL's reward scalings")


def check_report_to(value: Any) -> str | None:
    """One of transformers' logging integrations, or none; and its package installed (transformers
    would raise when the Trainer is built, after the model loaded)."""
    if value in (None, NO_REPORTING):
        return None
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    known = [NO_REPORTING, *INTEGRATION_TO_CALLBACK]
    reason = one_of(tuple(known), "transformers' logging integrations")(value)
    if reason:
        return reason
    if value != "flyte" and value not in get_available_reporting_integrations():  # flyte: not in that list
        return (f"is {value!r}, whose package is not installed here (transformers finds no {value}); "
                f"install it, or use report_to=tensorboard or report_to=none")
    return None
