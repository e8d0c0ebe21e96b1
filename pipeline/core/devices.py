"""How many CUDA GPUs this process can use: torch's answer, without importing torch where no GPU
driver is installed.

Every CLI command plans before it launches, and the plan asks for the GPU count. Importing torch
only to hear "none" was most of a planning process's time: `run --config configs/demo.yaml
--print-config` took 2.3 s with it and 0.8 s without (2-core CPU, no GPU), in every `run`,
`train` and `eval` the suite and a user start. torch (and a ROCm build of it) can only see a GPU
through its driver's device file, so where none of them exists the count is 0 without asking;
where one exists, torch is asked as before.
"""
from __future__ import annotations

import os
import sys

# NVIDIA's driver (every CUDA context opens it), AMD ROCm's kernel driver, WSL2's GPU paravirtualization
DRIVER_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def gpu_count() -> int:
    """torch.cuda.device_count() where CUDA is available, else 0 (CUDA_VISIBLE_DEVICES applies)."""
    if sys.platform in ("linux", "darwin") and not any(os.path.exists(f) for f in DRIVER_FILES):
        return 0  # no driver: torch would find no device (macOS has no CUDA at all)
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
