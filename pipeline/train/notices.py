"""Library notices known to be harmless in the pipeline's training processes, dropped there.

Every rank of a launch printed each of them, and a grid of many units printed them per unit, in
the libraries' words and often alarming ("annihilate the benefits"). Each is either said once by
rank 0's plan in our words, or true of every CPU run:

- TRL's "You are importing from 'trl.experimental' ...": GRPO's `rollout_func` and `env_mask` are
  TRL's experimental API; TRL is pinned to 1.16.x for it (docs/install.md). Silenced with TRL's
  own switch (TRL_EXPERIMENTAL_SILENCE); the grpo plan says it once (EXPERIMENTAL_TRL_LINE).
- TRL's "You are using a per_device_train_batch_size of 1 with padding-free training ...": dropped
  where our plan chose one trajectory per micro-batch and printed why
  (pipeline.train.speed.micro_batch_cap); where the user set 1 themselves it stays.
- DeepSpeed's "Setting accelerator to CPU. If you have GPU ...", logged when it is imported (a
  plain CPU launch imports it too, through transformers): dropped only where torch sees no CUDA
  device, so the plan's precision and launch lines already say where training runs. On a GPU
  node it would mean DeepSpeed missed the GPUs, and it stays.
"""

from __future__ import annotations

import logging
import os

EXPERIMENTAL_TRL_LINE = ("[grpo] rollouts through TRL's experimental rollout_func / env_mask API "
                         "(TRL pinned to 1.16.x for it: docs/install.md)")
PADDING_FREE_NOTE = "with padding-free training. Using a batch size of 1"  # TRL's logger.warning
DEEPSPEED_CPU_NOTE = "Setting accelerator to CPU"  # DeepSpeed's get_accelerator()
TRL_SFT_LOGGER = "trl.trainer.sft_trainer"
DEEPSPEED_LOGGER = "DeepSpeed"  # deepspeed.utils.logging's logger, the one get_accelerator logs to


class _Drop(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def drop_notice(logger_name: str, text: str) -> None:
    """Drop the records of `logger_name` whose message holds `text` (once per logger and text).
    A logger-level filter: set before the library creates its handlers, it holds after."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _Drop) and f.text == text for f in logger.filters):
        logger.addFilter(_Drop(text))


def silence_library_notices() -> None:
    """Before the training libraries are imported (pipeline.train.script)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    if not torch.cuda.is_available():
        drop_notice(DEEPSPEED_LOGGER, DEEPSPEED_CPU_NOTE)


def drop_padding_free_note() -> None:
    """Where the plan printed why a micro-batch holds one trajectory."""
    drop_notice(TRL_SFT_LOGGER, PADDING_FREE_NOTE)
