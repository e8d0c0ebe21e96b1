"""The training memory estimate (pipeline/train/memory.py) against peak RSS per rank on this CPU.

Two launches of `train`, 2 DDP processes in fp32, micro-batch 1, max_length 512, 3 steps, on 16
FireAct ReAct trajectories: the tiny random student (3.2M parameters) and SmolLM2-135M. Each rank's
peak RSS (VmHWM, sampled from /proc while it runs) includes the interpreter, torch and the
tokenizer, which the estimate leaves out; their difference does not, and is compared with the
difference of the estimates (model states + activations; no CUDA context on a CPU).

    python bench/bench_train_memory.py     # ~2-3 min on 2 CPU cores
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from sft_testdata import fireact_records, write_dataset  # noqa: E402

from pipeline.hub.models import resolve_model_path  # noqa: E402
from pipeline.train import memory  # noqa: E402

SEQ = 512


def peak_rss_per_rank(cmd: list[str], log: Path) -> tuple[int, list[int]]:
    """(exit code, each rank's peak RSS in MiB): ranks are the launch's processes with LOCAL_RANK."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        peak: dict[int, int] = {}
        while proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if "LOCAL_RANK" in child.environ():
                        status = Path(f"/proc/{child.pid}/status").read_text()
                        hwm = next(line for line in status.splitlines() if line.startswith("VmHWM"))
                        peak[child.pid] = max(peak.get(child.pid, 0), int(hwm.split()[1]) >> 10)
                except (psutil.Error, OSError, StopIteration):
                    continue
            time.sleep(0.3)
    return proc.returncode, sorted(peak.values())


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-train-memory-"))
    write_dataset(work / "sft", "react", fireact_records(limit=16))
    smollm2 = memory.shape_of(json.loads((Path(resolve_model_path("smollm2")) / "config.json").read_text()))
    tiny = memory.Shape(2, 64, 128, 4, 4, 16, 49152, True)  # configs/students/tiny.yaml's random_model
    rows = {}
    for name, keys, shape in (("tiny", ["student=tiny", "init=random"], tiny),
                              ("smollm2", ["student=smollm2", "init=pretrained"], smollm2)):
        cmd = [sys.executable, "-m", "pipeline", "train", "--config", "configs/students/tiny.yaml", *keys,
               f"dataset_dir={work / 'sft'}", f"output_dir={work / name}", "max_steps=3", "global_batch_size=2",
               "max_per_device_batch_size=1", "precision=fp32", f"max_length={SEQ}", "save_steps=100",
               "num_processes=2", "accelerate_config=cpu_ddp", "resume=none"]
        code, ranks = peak_rss_per_rank(cmd, work / f"{name}.log")
        est = memory.estimate(memory.Launch(shape, "ddp", 2, "full", 16, (), 1, SEQ, False, False, mixed=False))
        rows[name] = {"exit": code, "params": shape.params, "peak_rss_per_rank_mib": ranks,
                      "estimate_mib": (est.states + est.activations) >> 20}
        print(name, rows[name], flush=True)
    measured = [b - a for a, b in zip(rows["tiny"]["peak_rss_per_rank_mib"], rows["smollm2"]["peak_rss_per_rank_mib"], strict=False)]
    estimated = rows["smollm2"]["estimate_mib"] - rows["tiny"]["estimate_mib"]
    print(f"SmolLM2 - tiny, per rank: measured {measured} MiB, estimated {estimated} MiB; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
