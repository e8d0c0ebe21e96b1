"""The body of a script `accelerate launch` runs (pipeline/finetune.py, pipeline/rl/train.py): its
config from --config and key=value overrides, then the run; a bad input or a failed write ends in
one line (relayed by the stage that launched it, pipeline/train/failures.py), a bug keeps its
traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from pipeline.core.config import add_config_arguments, stage_config
from pipeline.core.errors import PipelineError
from pipeline.core.progress import use_lines_off_terminal
from pipeline.train.failures import report_error, storage_error_message
from pipeline.train.notices import silence_library_notices


def script_main(argv: list[str] | None, config_class: type, *, section: str, resolve: Callable, run: Callable,
                prog: str, description: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_config_arguments(parser, config_class)
    args = parser.parse_args(argv)
    cfg = None
    try:
        use_lines_off_terminal()  # the launching stage chose bars or lines for its whole output
        silence_library_notices()  # each rank would print them; the plan says what they say, once
        cfg = stage_config(config_class, args, section=section, finish=resolve)
        run(cfg)
        end_process_group()
    except PipelineError as exc:
        return report_error(str(exc), exc.exit_code)
    except Exception as exc:  # a full disk while checkpointing, an unwritable output_dir
        message = storage_error_message(exc, cfg.output_dir if cfg else None)
        if message is None:
            raise  # a bug: keep its traceback
        return report_error(message, 2)
    return 0


def end_process_group() -> None:
    """Destroy the process group of a run that finished. Left to the interpreter's exit, Gloo's
    worker threads met its teardown and a rank could abort ("terminate called without an active
    exception", SIGABRT) after a complete run, failing the launch: the paper rehearsal's 70B LoRA
    ZeRO-3 training, its final/ saved, exit 1 (in a fresh-clone suite). Measured here: 8 of 20
    two-rank Gloo runs aborted so, 0 of 20 with this. Only after success: a destroy beside a
    failed rank can hang, as torchtitan found."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
