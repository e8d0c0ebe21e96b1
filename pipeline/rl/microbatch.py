"""GRPO's micro-batches without the step's padding: each trimmed to its own longest rollout.

TRL 1.16's GRPOTrainer pads all of a step's rollouts to the longest one
(`_generate_and_score_completions`: prompts on the left, completions on the right), shuffles
them and splits them into the step's micro-batches (`_prepare_inputs`: `split_tensor_dict`)
without trimming, so every forward/backward of the update runs at the step's longest length.
ReAct episodes differ several-fold in length (one search and an answer against seven steps), so
most of that work is padding. Here, once TRL has buffered a step's micro-batches:

- `regroup` puts them back into one batch, orders its rollouts by length (where the loss allows,
  `pairing_keeps_the_loss`) and splits it again into as many micro-batches of the same size, so a
  micro-batch holds rollouts of similar lengths;
- `trim` cuts each micro-batch's columns that are padding in every one of its rows: the prompts'
  left columns, the completions' right columns (the per-token tensors with them).

The step's loss and gradient are those of TRL's split (tests/test_grpo.py checks them in fp32):
padding is masked out of attention and loss, and with equal-sized micro-batches every loss type
but the per-micro-batch ones (`bnpo`, an entropy bonus or quantile mask) sums each rollout's
terms with the same weights in any grouping. Left padding moves a prompt's absolute positions
(TRL passes no position ids), which RoPE's relative attention does not see beyond rounding.
"""

from __future__ import annotations

from typing import Any

PROMPT_KEYS = ("prompt_ids", "prompt_mask")  # left-padded: trimmed on the left
# Right-padded per-token tensors of the completions: trimmed on the right with completion_mask.
COMPLETION_KEYS = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps", "ref_per_token_logps",
                   "sampling_per_token_logps", "importance_sampling_ratio")
PER_ROLLOUT_KEYS = ("advantages",)
SCALAR_KEYS = ("num_items_in_batch",)  # the whole step's count, the same in every micro-batch
KNOWN_KEYS = set(PROMPT_KEYS + COMPLETION_KEYS + PER_ROLLOUT_KEYS + SCALAR_KEYS)
PER_MICRO_BATCH_LOSSES = ("bnpo",)  # normalised by each micro-batch's own token count


def trimmable(batch: dict[str, Any]) -> bool:
    """Text-only batches of the keys above; a batch with others (images, token type ids) is left
    as TRL made it (their columns would need their own rules)."""
    return set(batch) <= KNOWN_KEYS


def pairing_keeps_the_loss(trainer: Any) -> bool:
    """Whether grouping a step's rollouts differently leaves its loss and gradient unchanged."""
    return (trainer.loss_type not in PER_MICRO_BATCH_LOSSES and not trainer._entropy_bonus_enabled
            and trainer.top_entropy_quantile >= 1.0)  # TRL's entropy bonus and quantile mask: per micro-batch


def regroup(batches: list[dict[str, Any]], by_length: bool) -> list[dict[str, Any]]:
    """The step's micro-batches again, each trimmed (`trim`); with `by_length`, their rollouts
    ordered by length first (shortest first; ties keep TRL's shuffled order)."""
    import torch
    from trl.trainer.utils import split_tensor_dict

    if not batches or not all(trimmable(b) for b in batches):
        return batches
    if by_length and len(batches) > 1:
        whole = {key: _concat([b[key] for b in batches]) for key in batches[0]}
        lengths = whole["prompt_mask"].sum(1) + whole["completion_mask"].sum(1)
        order = torch.sort(lengths, stable=True).indices
        whole = {key: value if value is None or value.ndim == 0 else value[order] for key, value in whole.items()}
        batches = split_tensor_dict(whole, len(batches))
    return [trim(b) for b in batches]


def _concat(values: list):
    import torch

    if values[0] is None or values[0].ndim == 0:
        return values[0]
    return torch.cat(values)


def trim(batch: dict[str, Any]) -> dict[str, Any]:
    """`batch` without the columns that are padding in all of its rows."""
    prompt_used = batch["prompt_mask"].any(0).nonzero()
    first = int(prompt_used[0]) if len(prompt_used) else batch["prompt_mask"].size(1)
    completion_used = batch["completion_mask"].any(0).nonzero()
    end = int(completion_used[-1]) + 1 if len(completion_used) else 1  # TRL's logits_to_keep needs a column
    width = batch["completion_ids"].size(1)
    out = dict(batch)
    for key in PROMPT_KEYS:
        out[key] = batch[key][:, first:]
    for key in COMPLETION_KEYS:
        value = batch.get(key)
        if value is not None and value.ndim == 2 and value.size(1) == width:  # a sequence-level ratio is (B, 1)
            out[key] = value[:, :end]
    return out
