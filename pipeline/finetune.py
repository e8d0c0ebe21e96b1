"""Fine-tune a student on one trajectory format's SFT dataset with TRL's SFTTrainer (+ PEFT), under accelerate.

    # one CPU process (the demo); `pipeline/finetune.py` in place of `-m pipeline.finetune` works too
    accelerate launch --config_file accelerate_configs/cpu.yaml -m pipeline.finetune \\
        --config configs/students/smollm2-135m.yaml format=react dataset_dir=data/sft
    # 2 CPU processes (DDP over gloo)
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml -m pipeline.finetune --config ...
    # 8 GPUs, DeepSpeed ZeRO-3
    accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml -m pipeline.finetune \\
        --config configs/students/llama-3.1-8b.yaml format=react
    # or let the `train` stage pick the accelerate config:  python -m pipeline train --config ...

The global batch (64, the paper's) is split as per_device x grad_accum x processes at launch.
Steps default to the paper's table by format and size class. Checkpoints go to
checkpoints/<experiment>/<student>/<format>/checkpoint-N; a re-launch resumes the latest
COMPLETE one; the trained model (or LoRA adapter) + tokenizer + manifest.json land in .../final.

This file is the entry `accelerate launch` names; the work is in pipeline/train/: config.py (the
keys), script.py (this main's body), plan.py (the run resolved once and printed once: launch,
precision, attention, loss, batch, FSDP), run.py (the steps, in order), data.py, model.py,
trainer.py, checkpoints.py, final.py.
"""

from __future__ import annotations

import sys

from pipeline.train.config import FinetuneConfig, resolve
from pipeline.train.run import run
from pipeline.train.script import script_main


def main(argv: list[str] | None = None) -> int:
    return script_main(argv, FinetuneConfig, section="train", resolve=resolve, run=run,
                       prog="python -m pipeline.finetune", description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
