"""What the benchmarks say about the machine they ran on: its load, its compute limits, the spread.

Shared by bench_train.py and bench_generate.py. The compute limit is measured, not looked up:
the best of a few large matmuls (the shape of a 135M Llama's MLP on 2,048 tokens, laid out as
nn.Linear lays out its weight, the path the models take: a bf16 `a @ b` with a row-major `b`
takes a much slower kernel on CPUs without bf16 units) in fp32 and in bf16, in the same process as
the benchmark, so "fraction of the limit" compares like with like.
"""

from __future__ import annotations

import os
import statistics
import time

MATMUL = (2048, 576, 1536)  # tokens x hidden x MLP width of SmolLM2-135M


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPUs"


def matmul_gflops(dtype, repeats: int = 3, shape: tuple[int, int, int] = MATMUL) -> float:
    """Best-of-`repeats` GFLOP/s of F.linear((m x k), weight (n x k)) in `dtype`."""
    import torch
    from torch.nn.functional import linear
    m, k, n = shape
    x, weight = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    linear(x, weight)  # warm up (oneDNN picks and caches its kernel)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        linear(x, weight)
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def compute_limits() -> dict[str, float]:
    import torch
    limits = {"fp32": matmul_gflops(torch.float32), "bf16": matmul_gflops(torch.bfloat16)}
    m, k, n = MATMUL
    print(f"compute limit (best of 3 matmuls {m}x{k}x{n}): fp32 {limits['fp32']:.1f} GFLOP/s, "
          f"bf16 {limits['bf16']:.1f} GFLOP/s (bf16 / fp32 = {limits['bf16'] / limits['fp32']:.2f}x); "
          f"{load_average()}", flush=True)
    return limits


def spread(values: list[float]) -> str:
    """median [min-max] over repeats, and the relative spread."""
    med = statistics.median(values)
    rel = (max(values) - min(values)) / med if med else 0.0
    return f"{med:.3g} [{min(values):.3g}-{max(values):.3g}, spread {100 * rel:.0f}%, n={len(values)}]"


def interleaved(names: tuple[str, ...], repeats: int):
    """(repeat, name) for each run of a benchmark comparing `names`: every repeat runs each once,
    in the opposite order to the one before, so that a drift in the machine's load favours none."""
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else tuple(reversed(names)):
            yield repeat, name
