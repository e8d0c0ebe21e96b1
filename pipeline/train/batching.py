"""Packing that keeps the paper's batch: a micro-batch of per_device trajectories is packed into
fixed-length rows, so a step still trains on global_batch_size trajectories.

TRL's `packing=True` packs the whole dataset into rows of max_length BEFORE batching, so its
per_device_train_batch_size counts rows, each holding several trajectories: "batch 64" would
silently become 64 rows (several hundred trajectories) per step. Here the trainer samples
trajectories as in every other mode and the collator packs each micro-batch:

    padding_free  one row: the micro-batch's trajectories end to end (TRL's collator)
    packing       rows of exactly max_length tokens, trajectories placed best-fit-decreasing,
                  never split; a row's unused tail is padding (labels -100) whose position ids
                  continue the row's last trajectory, so it starts no new sequence
    padded        one row per trajectory, right-padded (TRL's collator)

In the packed modes position_ids restart at 0 at each trajectory. SDPA and eager attention build
the block-diagonal mask from them in any number of rows (transformers' masking_utils
find_packed_sequence_indices). Flash attention infers sequence boundaries from position_ids only
for a batch of ONE row (modeling_flash_attention_utils._is_packed_sequence: `batch_size != 1`
returns False) and otherwise runs plain causal attention over each whole row, so the trajectories
of a row would attend to each other. A packed batch therefore also carries the boundaries
themselves, `cu_seq_lens_q/k` and `max_length_q/k` over the rows laid end to end (what
transformers' own DataCollatorWithFlattening passes with return_flash_attn_kwargs): the flash path
uses them as given (one varlen call over all rows), SDPA and eager ignore them.
"""

from __future__ import annotations

from pipeline.core.errors import PipelineError
from pipeline.train.sft import IGNORE_INDEX


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices grouped into bins of at most `capacity` tokens (longest first, tightest fit)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > capacity:
            raise PipelineError(f"an example of {lengths[i]} tokens does not fit a packed row of {capacity}; raise max_length")
        fits = [b for b in range(len(bins)) if room[b] >= lengths[i]]
        if fits:
            b = min(fits, key=lambda b: room[b])
        else:
            bins.append([])
            room.append(capacity)
            b = len(bins) - 1
        bins[b].append(i)
        room[b] -= lengths[i]
    return bins


class PackingCollator:
    """Collates a micro-batch of tokenised trajectories into [rows, max_length] packed rows."""

    def __init__(self, pad_token_id: int, max_length: int):
        self.pad_token_id, self.max_length = pad_token_id, max_length

    def __call__(self, examples: list[dict]) -> dict:
        import torch
        rows = best_fit_decreasing([len(e["input_ids"]) for e in examples], self.max_length)
        ids, labels, positions = [], [], []
        for row in rows:
            row_ids, row_labels, row_pos = [], [], []
            for i in row:
                n = len(examples[i]["input_ids"])
                row_ids += examples[i]["input_ids"]
                # a first token is never predicted within its trajectory; in a row, the label there
                # would be the previous trajectory's last token's target: never train across the seam
                row_labels += [IGNORE_INDEX] + examples[i]["labels"][1:]
                row_pos += list(range(n))
            tail = self.max_length - len(row_ids)
            row_ids += [self.pad_token_id] * tail
            row_labels += [IGNORE_INDEX] * tail
            row_pos += list(range(row_pos[-1] + 1, row_pos[-1] + 1 + tail))
            ids.append(row_ids)
            labels.append(row_labels)
            positions.append(row_pos)
        position_ids = torch.tensor(positions)
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "position_ids": position_ids,
                **flash_boundaries(position_ids)}


def flash_boundaries(position_ids) -> dict:
    """The flash varlen kwargs for packed rows: every sequence start (position 0) over the rows
    laid end to end, the total as the last bound, the longest sequence. A row always starts a
    sequence, so no sequence spans two rows; a row's padding tail continues its last trajectory
    (labels -100), as its position ids say."""
    import torch
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().view(-1)
    bounds = torch.cat([starts, torch.tensor([flat.numel()])]).to(torch.int32)
    longest = int(bounds.diff().max())
    return {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": longest, "max_length_k": longest}


def count_trajectories(batch: dict) -> int:
    """Trajectories in a collated batch: sequence starts (position 0) in packed rows, rows otherwise."""
    if "position_ids" in batch:
        return int((batch["position_ids"] == 0).sum())
    return int(batch["input_ids"].shape[0])
