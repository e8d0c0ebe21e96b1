"""GPU check: `batching: packing` under flash attention trains each trajectory on itself alone.

    python scripts/gpu_checks/packing_flash.py                    # every implementation found here
    python scripts/gpu_checks/packing_flash.py --implementations sdpa flash_attention_2

Needs only torch and transformers (plus flash_attn / flash_attn_interface / kernels for the
flash implementations); the model is a tiny Llama built in code, so nothing is downloaded.

For each attention implementation: the per-token losses of a packed batch as training collates
it (pipeline/train/batching.py PackingCollator: several fixed-length rows, with the flash varlen
boundaries) against the same trajectories run one by one. Before the fix the collator gave
several rows with position_ids alone, and transformers' flash path then ran plain causal
attention over each whole row (it infers boundaries from position_ids for one row only), so a
row's trajectories attended to each other. The same rows without the boundaries are run too, as
a control: under a flash kernel they must differ (it shows the check can fail); under eager and
SDPA they need not (those build the block-diagonal mask from position_ids in any row count).

Prints one line per implementation, PASS / FAIL / SKIP with the largest difference; exit 1 on
any FAIL. The CPU tests (tests/test_packing.py) run the same functions under eager, SDPA and a
plain-torch stand-in for the flash kernel.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: pipeline/

from pipeline.train.batching import PackingCollator, best_fit_decreasing  # noqa: E402
from pipeline.train.sft import IGNORE_INDEX  # noqa: E402

LENGTHS = (37, 21, 50, 12, 29, 44, 8, 33)  # trajectories of a micro-batch, placed into rows of ROW tokens
ROW = 96
VOCAB = 211
# Largest per-token loss difference allowed between packed and one-by-one (same kernel, another
# batch shape): float32 reduction noise; bf16 rounding (SDPA in bf16 on CPU: 2.2e-2 measured).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 2e-2}


def tiny_llama(attn_implementation: str, dtype: torch.dtype, device: str, seed: int = 0):
    """A 2-layer Llama with grouped-query attention; a large init makes attention peaky, so a
    trajectory that sees another's tokens changes its losses visibly."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                         initializer_range=0.2, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    return model.to(device).eval()


def trajectories(lengths=LENGTHS, seed: int = 1) -> list[dict]:
    """Random token ids; the first is a prompt token (label -100), as in the SFT data."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [IGNORE_INDEX] + ids[1:]})
    return out


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each position's next-token prediction, [rows, T - 1] (0 where ignored)."""
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX,
                           reduction="none")


def packed_vs_alone(model, examples: list[dict], row: int = ROW, boundaries: bool = True) -> float:
    """Largest |per-token loss packed - per-token loss alone| over every trained token.
    boundaries=False drops the flash varlen kwargs from the packed batch (the old collator)."""
    device = next(model.parameters()).device
    batch = PackingCollator(pad_token_id=0, max_length=row)(examples)
    if not boundaries:
        batch = {k: v for k, v in batch.items() if not k.startswith(("cu_seq_lens", "max_length"))}
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    with torch.no_grad():
        packed = token_losses(model(**batch, use_cache=False).logits, batch["labels"])
        worst = 0.0
        for r, members in enumerate(best_fit_decreasing([len(e["input_ids"]) for e in examples], row)):
            start = 0
            for i in members:
                ids = torch.tensor([examples[i]["input_ids"]], device=device)
                n = ids.shape[1]
                alone = token_losses(model(input_ids=ids, use_cache=False).logits, ids)[0]
                worst = max(worst, (packed[r, start:start + n - 1] - alone).abs().max().item())
                start += n
    return worst


def available(name: str) -> str | None:
    """None when `name` can run here, else why not."""
    if name in ("eager", "sdpa"):
        return None
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    needs = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}.get(name, "kernels")
    if importlib.util.find_spec(needs) is None:
        return f"the {needs} package is not installed"
    return None


def check(name: str, dtype: torch.dtype, device: str) -> tuple[str, str]:
    """(PASS | FAIL | SKIP, details) for one attention implementation."""
    why = available(name)
    if why:
        return "SKIP", why
    try:
        model = tiny_llama(name, dtype, device)
    except Exception as exc:  # a kernel that cannot be loaded here (e.g. offline, not cached)
        return "SKIP", f"cannot load: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    examples = trajectories()
    fixed, control = packed_vs_alone(model, examples), packed_vs_alone(model, examples, boundaries=False)
    tol = TOLERANCE[dtype]
    flash = name not in ("eager", "sdpa")
    ok = fixed <= tol and (not flash or control > 10 * tol)
    details = (f"packed vs one by one: max |d loss| {fixed:.2e} (tolerance {tol:.0e}); without the boundaries "
               f"{control:.2e}" + (" (must exceed 10x tolerance: the check can fail)" if flash else ""))
    return ("PASS" if ok else "FAIL"), details


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--implementations", nargs="+",
                        default=["eager", "sdpa", "flash_attention_2", "flash_attention_3", "kernels-community/flash-attn2"])
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                        help="default: bf16 on a GPU (flash kernels take half precision), fp32 on CPU")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    dtype = names[args.dtype] if args.dtype else (torch.bfloat16 if device == "cuda" else torch.float32)
    print(f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, {dtype}, "
          f"torch {torch.__version__}, transformers {__import__('transformers').__version__}")
    failed = False
    for name in args.implementations:
        verdict, details = check(name, dtype, device)
        failed |= verdict == "FAIL"
        print(f"{verdict} {name}: {details}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
