"""The one list of what a training launch (`train` or `grpo`) refuses, run before anything loads
and before the resolved config is written into the output folder: by the launch and its
`--dry-run` alike (pipeline/stages/train.py, pipeline/stages/grpo.py), and by `run` for each
selected train and grpo unit, at `--print-config` and before its first unit (pipeline/stages/grid/checks.py
check_selected). What an earlier phase of a grid makes (a dataset, a fine-tuned start) is left out
there (`made_earlier`) and checked when the unit's phase starts, by the same list.

    common   the accelerate config readable, and the DeepSpeed JSON it names; a DeepSpeed launch
             with no GPU in sight; the
             finetuning / optimizer / strategy combination (pipeline.train.checks.check_config:
             QLoRA and 8-bit optimizers need a GPU and bitsandbytes); embedded models' packages
             (an embedded student, tokenizer or base); a `resume` path a complete checkpoint;
             the output folder writable
    train    the student (a folder that is not there); the dataset present, complete, readable
             and not empty; under long_examples=error, no example longer than max_length
    grpo     (pipeline/stages/grpo.py preflight: the start, the questions, the held-out set, the index)

The launched child (pipeline/train/run.py, pipeline/rl/train.py) runs check_config and the
per-process device checks again on every rank: a launch made by hand is checked too.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pipeline.core.config import read_yaml
from pipeline.core.errors import PipelineError
from pipeline.train.checks import check_config, is_complete_checkpoint
from pipeline.train.deepspeed_setup import (
    DEEPSPEED_CONFIG_ENV,
    check_deepspeed_device,
    settle_deepspeed_config,
)
from pipeline.train.launch import Launch, deepspeed_variables


def preflight_launch(cfg, config_path: Path, world: int, gpus: int) -> None:
    """What every training launch of `cfg` (a FinetuneConfig or GrpoConfig) refuses, in one line."""
    from pipeline.core.storage import check_writable_dir
    from pipeline.hub.models import require_installed

    accelerate = read_yaml(config_path)
    distributed = accelerate.get("distributed_type")
    check_deepspeed_device(distributed == "DEEPSPEED", gpus > 0, cfg.deepspeed_on_cpu, world)  # before 8 CPU processes start
    named = (accelerate.get("deepspeed_config") or {}).get("deepspeed_config_file")
    if distributed == "DEEPSPEED" and named:  # the DeepSpeed JSON readable, as every rank settles it first
        settle_deepspeed_config({**deepspeed_variables(), DEEPSPEED_CONFIG_ENV: str(named)})
    check_config(cfg.finetuning, cfg.optim, Launch.foreseen(distributed, world).strategy, gpus > 0,
                 importlib.util.find_spec("bitsandbytes") is not None)
    for model in (cfg.student, cfg.tokenizer, getattr(cfg, "base_model", None)):
        require_installed(model)  # an embedded model's package (the one-line install hint)
    check_resume_path(cfg.resume)
    check_writable_dir(cfg.output_dir, "output_dir")


def check_resume_path(resume: str) -> None:
    """`resume` given as a path must be a complete checkpoint (the child refused it after the
    model had loaded); latest and none need nothing."""
    if resume in ("latest", "none"):
        return
    if not Path(resume).is_dir():
        raise PipelineError(f"resume: {resume} not found; give a checkpoint-N folder, latest (the newest complete "
                            "one in output_dir, if any) or none")
    if not is_complete_checkpoint(Path(resume)):
        raise PipelineError(f"resume: {resume} is not a complete checkpoint (needs trainer_state.json, weights, "
                            "optimizer state); give another, latest, or none")


def check_training_inputs(cfg) -> None:
    """A `train` launch's own inputs: the student, the dataset (present, complete, not empty), and
    no example over max_length where long_examples=error (the child tokenises the same way)."""
    from pipeline.hub.models import looks_like_path
    from pipeline.train.data import load_sft_records, load_tokenizer
    from pipeline.train.sft import tokenize_records

    if cfg.init == "pretrained" and looks_like_path(cfg.student) and not Path(cfg.student).expanduser().exists():
        raise PipelineError(f"student: {cfg.student} not found; give a model folder that exists, a hub id, or 'smollm2'")
    dataset_path, records = load_sft_records(cfg)  # refuses an empty one, as the child would
    if cfg.long_examples == "error" and cfg.max_length is not None:
        tokenize_records(records, load_tokenizer(cfg), mask_observations=cfg.mask_observations,
                         max_length=cfg.max_length, long_examples="error")


def check_question_sets(cfg) -> None:
    """A GRPO config's question sets known to its task: the training set, and the held-out curve's
    when it is on (the child loaded that one after the model and its first rollouts)."""
    from pipeline.tasks import get_task

    task = get_task(cfg.task)
    task.check_question_set(cfg.questions)
    if cfg.heldout.every:
        try:
            task.check_question_set(cfg.heldout.questions)
        except PipelineError as exc:
            raise PipelineError(f"heldout.questions: {exc}") from None
