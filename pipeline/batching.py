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

In the packed modes position_ids restart at 0 at each trajectory, from which transformers
builds the block-diagonal attention (SDPA) or the varlen boundaries (flash attention).
"""

from __future__ import annotations

from pipeline.errors import PipelineError
from pipeline.sft import IGNORE_INDEX


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
                row_labels += examples[i]["labels"]
                row_pos += list(range(n))
            tail = self.max_length - len(row_ids)
            row_ids += [self.pad_token_id] * tail
            row_labels += [IGNORE_INDEX] * tail
            row_pos += list(range(row_pos[-1] + 1, row_pos[-1] + 1 + tail))
            ids.append(row_ids)
            labels.append(row_labels)
            positions.append(row_pos)
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels),
                "position_ids": torch.tensor(positions)}


def count_trajectories(batch: dict) -> int:
    """Trajectories in a collated batch: sequence starts (position 0) in packed rows, rows otherwise."""
    if "position_ids" in batch:
        return int((batch["position_ids"] == 0).sum())
    return int(batch["input_ids"].shape[0])
