"""`batching: packing` (pipeline/train/batching.py): a packed micro-batch trains each trajectory on
itself alone, under every attention implementation this machine has.

The per-token losses of a packed batch (several fixed-length rows) must equal those of its
trajectories run one by one, on a tiny Llama built in code: under eager and SDPA for real, under
a flash kernel where one is importable (a CUDA GPU), and under transformers' real flash dispatch
with a plain-torch STAND-IN for the kernel (tests/flash_reference.py), which is where the old
collator's rows (position_ids alone) attended across trajectories. The functions are those of
scripts/gpu_checks/packing_flash.py, the check a GPU machine runs with the real kernels.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "gpu_checks"))

from flash_reference import reference_flash_kernel  # noqa: E402
from packing_flash import (  # noqa: E402
    ROW,
    TOLERANCE,
    available,
    check,
    packed_vs_alone,
    tiny_llama,
    trajectories,
)

from pipeline.train.batching import PackingCollator, best_fit_decreasing  # noqa: E402

FP32 = TOLERANCE[torch.float32]
HERE = ["eager", "sdpa", *(name for name in ("flash_attention_2", "flash_attention_3") if available(name) is None)]


@pytest.mark.parametrize("implementation", HERE)
def test_packed_per_token_losses_equal_one_by_one(implementation):
    cuda = implementation.startswith("flash")
    model = tiny_llama(implementation, torch.bfloat16 if cuda else torch.float32, "cuda" if cuda else "cpu")
    assert packed_vs_alone(model, trajectories()) <= TOLERANCE[torch.bfloat16 if cuda else torch.float32]


def test_flash_dispatch_keeps_trajectories_apart():
    """transformers' own flash path (the kernel a stand-in): with the collator's boundaries each
    trajectory sees only itself; the same rows without them (the old collator's batch) run plain
    causal attention over each row, and the losses move far beyond float noise."""
    model = tiny_llama("sdpa", torch.float32, "cpu")
    model.config._attn_implementation = "flash_attention_2"
    examples = trajectories()
    with reference_flash_kernel():
        fixed = packed_vs_alone(model, examples)
        old = packed_vs_alone(model, examples, boundaries=False)
    assert fixed <= FP32, fixed
    assert old > 100 * FP32, old


def test_packed_batch_states_every_trajectory_bound():
    examples = trajectories()
    batch = PackingCollator(pad_token_id=0, max_length=ROW)(examples)
    rows = best_fit_decreasing([len(e["input_ids"]) for e in examples], ROW)
    assert batch["input_ids"].shape == (len(rows), ROW) and len(rows) > 1
    bounds = []
    for r, members in enumerate(rows):
        start = r * ROW
        for i in members:
            bounds.append(start)
            start += len(examples[i]["input_ids"])
    bounds.append(len(rows) * ROW)  # each row's padding tail belongs to its last trajectory
    assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == bounds
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    longest = max(b - a for a, b in itertools.pairwise(bounds))
    assert batch["max_length_q"] == batch["max_length_k"] == longest and isinstance(longest, int)
    # no label trains one trajectory's token from the one before it in the row
    assert all(batch["labels"][b // ROW, b % ROW] == -100 for b in bounds[:-1])


def test_the_gpu_check_runs_and_reports_here():
    """The prepared GPU script's verdicts on this machine: eager/SDPA checked, flash skipped
    with the reason when there is no GPU."""
    verdict, details = check("sdpa", torch.float32, "cpu")
    assert verdict == "PASS" and "packed vs one by one" in details
    if not torch.cuda.is_available():
        assert check("flash_attention_2", torch.bfloat16, "cpu") == ("SKIP", "needs a CUDA GPU")
