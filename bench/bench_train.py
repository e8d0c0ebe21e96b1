"""Training throughput: our trainer setup vs TRL's SFTTrainer with default settings, same data,
same model, same steps, one process, one run.

    .venv/bin/python bench/bench_train.py                      # tiny model, then SmolLM2-135M
    .venv/bin/python bench/bench_train.py --models tiny --steps 8

Data: FireAct's 500 real GPT-4 ReAct trajectories (../shared/data), rendered by
pipeline.trajectory. Setups (per-device batch 8, fp32, CPU):
  trl-default  SFTTrainer as shipped: prompt/completion records tokenised by TRL, padded batches,
               no packing, TRL's default (fused, chunked) loss.
  trl+loss     the same but with the model's own loss: separates the two gains.
  ours         pipeline.finetune: our tokenisation (pipeline.sft), padding-free batches, the
               model's own loss (ModelLossSFTTrainer).
Throughput = real (non-pad) tokens / time of steps 2..N (step 1 warms up). Padding waste = pad
positions / all positions computed. Both see the same examples in the same order (same seed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "fireact" / "alpaca_format" / "hotpotqa.json"


def records() -> list[dict]:
    from pipeline.trajectory import parse, render
    out = []
    for i, row in enumerate(json.loads(DATA.read_text(encoding="utf-8"))):
        rendered = render(parse(f"Question: {row['instruction']}\n{row['output']}", "react"))
        out.append({"id": str(i), "prompt": rendered.prompt, "completion": rendered.completion,
                    "observation_spans": [list(s) for s in rendered.observation_spans]})
    return out


class CountingCollator:
    """Wraps a collator; records real tokens and computed positions of every batch."""

    def __init__(self, inner, pad_id: int):
        self.inner, self.pad_id, self.batches = inner, pad_id, []

    def __call__(self, examples):
        batch = self.inner(examples)
        real = sum(len(e["input_ids"]) for e in examples)
        self.batches.append((real, batch["input_ids"].numel()))
        return batch


def step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.durations = []

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.durations.append(time.perf_counter() - self._t)

    return StepTimer()


def finetune_cfg(model: str, out: Path, steps: int, batch: int):
    from pipeline.config import load_config
    from pipeline.finetune import FinetuneConfig, resolve
    base = ["init=random", "tokenizer=smollm2", "student=tiny", "learning_rate=1.0e-3"] if model == "tiny" else [
        "student=smollm2", "learning_rate=2.0e-5"]
    return resolve(load_config(FinetuneConfig, None, base + [
        f"max_steps={steps}", f"global_batch_size={batch}", f"per_device_batch_size={batch}", "precision=fp32",
        "report_to=none", "save_steps=100000", f"output_root={out}", "logging_steps=1000", "lr_scheduler=constant",
        "warmup_ratio=0.0"]))


def run_setup(name: str, model_name: str, recs: list[dict], steps: int, batch: int, out: Path) -> dict:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from pipeline.finetune import (
        load_student,
        load_tokenizer,
        model_loss_trainer_class,
        sft_arguments,
    )
    from pipeline.sft import tokenize_records

    cfg = finetune_cfg(model_name, out / name, steps, batch)
    tokenizer = load_tokenizer(cfg)
    model = load_student(cfg, tokenizer)
    timer = step_timer()
    if name == "ours":
        examples, report = tokenize_records(recs, tokenizer)
        args = sft_arguments(cfg, batch, 1, report.max_length, bf16=False, distributed_cpu=False)
        collator = CountingCollator(DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id,
                                                                    padding_free=True), tokenizer.pad_token_id)
        trainer = model_loss_trainer_class()(model=model, args=args, train_dataset=Dataset.from_list(examples),
                                             processing_class=tokenizer, data_collator=None, callbacks=[timer])
        trainer.data_collator = collator  # same collator TRL built, wrapped to count
    else:
        # TRL's defaults: only the run length, batch and output are set (plus fp32 on CPU)
        args = SFTConfig(output_dir=str(out / name), max_steps=steps, per_device_train_batch_size=batch,
                         learning_rate=cfg.learning_rate, lr_scheduler_type="constant", report_to=[],
                         save_strategy="no", bf16=False, logging_steps=1000, seed=cfg.seed, data_seed=cfg.seed,
                         dataloader_pin_memory=False)
        data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in recs])
        trainer_class = SFTTrainer if name == "trl-default" else model_loss_trainer_class()
        trainer = trainer_class(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                                callbacks=[timer])
        collator = CountingCollator(trainer.data_collator, tokenizer.pad_token_id)
        trainer.data_collator = collator
    trainer.train()
    timed = collator.batches[1:steps]  # step 1 warms up
    seconds = sum(timer.durations[1:])
    real = sum(r for r, _ in timed)
    positions = sum(p for _, p in timed)
    return {"setup": name, "tokens_per_s": real / seconds, "s_per_step": seconds / max(1, len(timed)),
            "padding_waste": 1 - real / positions, "real_tokens": real}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--steps", type=int, default=0, help="steps per setup (default: tiny 6, smollm2 3)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--setups", nargs="+", default=["trl-default", "trl+loss", "ours"])
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    recs = records()
    print(f"data: {len(recs)} FireAct ReAct trajectories; torch threads {torch.get_num_threads()}; "
          f"load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models:
            steps = args.steps or (6 if model_name == "tiny" else 3)
            results = {}
            for setup in args.setups:
                res = run_setup(setup, model_name, recs, steps, args.batch, Path(tmp) / model_name)
                results[setup] = res
                print(f"{model_name:8s} {setup:12s} {res['tokens_per_s']:9.1f} tokens/s  "
                      f"{res['s_per_step']:7.2f} s/step  padding waste {100 * res['padding_waste']:5.1f}%  "
                      f"({res['real_tokens']} tokens timed)", flush=True)
            if "ours" in results and "trl-default" in results:
                ratio = results["ours"]["tokens_per_s"] / results["trl-default"]["tokens_per_s"]
                print(f"{model_name:8s} ours / trl-default = {ratio:.2f}x (target >= 1.5x); "
                      f"load average {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
