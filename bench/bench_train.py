"""Training throughput on the same work, one process, one run: our trainer against TRL's
SFTTrainer on equal settings and as shipped, and bf16 against fp32.

    .venv/bin/python bench/bench_train.py                               # tiny model, all setups
    .venv/bin/python bench/bench_train.py --models tiny smollm2 --steps 6 --repeats 3
    .venv/bin/python bench/bench_train.py --setups ours ours-bf16       # just the precision ratio

Data: FireAct's 500 real GPT-4 ReAct trajectories (../shared/data), rendered by
pipeline.core.trajectory; every setup sees the same examples in the same order (same seed). Setups:
  trl-default  what a user gets out of the box: SFTTrainer as shipped (prompt/completion records
               tokenised by TRL, padded batches, TRL's fused chunked loss, gradient checkpointing
               ON), fp32 (TRL's own default, bf16=True, refuses to start on a CPU without use_cpu).
  trl-nogc     the same with gradient checkpointing off: equal settings to `ours`.
  ours-gc      pipeline.finetune (our tokenisation, batching and loss as configured) with
               gradient checkpointing on: equal settings to `trl-default`.
  ours         pipeline.finetune as configured by default (checkpointing off), fp32. On a CPU
               that is padding-free micro-batches of ONE trajectory x accumulation (no varlen
               flash kernel: pipeline/train_speed.micro_batch_cap).
  ours-row     `ours` with all of a step's trajectories packed padding-free into one row (the
               default before the cap): SDPA then needs a dense block-diagonal mask.
  ours-padded  `ours` with batching=padded (a step's trajectories as padded rows).
  ours-packing `ours` with batching=packing (whole trajectories best-fit into rows of the longest
               example's length; still `batch` trajectories per step).
  ours-chunked `ours` with loss=chunked (TRL's fused chunked LM-head loss: the GPU default).
  ours-bf16    `ours` with precision=bf16 (bf16 autocast over fp32 weights, the Trainer's own
               CPU bf16 path): the bf16 / fp32 ratio on the same work.
  trl+loss     (optional) trl-default with the model's own loss: separates the loss path's gain.
Throughput = real (non-pad) tokens / time of steps 2..N (step 1 warms up). Each setup runs
--repeats times, the setups' order rotated every repeat so load changes hit all of them; ratios
are taken within a repeat and reported as median [min-max]. Model FLOP/s = 6 x parameters x
tokens/s (attention's share and checkpointing's recompute not counted), as a fraction of the
bf16 and fp32 matmul limits measured at the start (bench/machine.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import compute_limits, load_average, spread  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "fireact" / "alpaca_format" / "hotpotqa.json"
SETUPS = {  # trainer, gradient checkpointing, precision, FinetuneConfig overrides
    "trl-default": ("trl", True, "fp32", ()),
    "trl-nogc": ("trl", False, "fp32", ()),
    "ours-gc": ("ours", True, "fp32", ()),
    "ours": ("ours", False, "fp32", ()),
    "ours-row": ("ours", False, "fp32", ("per_device_batch_size={batch}",)),
    "ours-padded": ("ours", False, "fp32", ("batching=padded", "per_device_batch_size={batch}")),
    "ours-packing": ("ours", False, "fp32", ("batching=packing", "per_device_batch_size={batch}")),
    "ours-chunked": ("ours", False, "fp32", ("loss=chunked",)),
    "ours-bf16": ("ours", False, "bf16", ()),
    "trl+loss": ("trl+loss", True, "fp32", ()),
}
# (numerator, denominator, what the ratio says)
RATIOS = [
    ("ours-gc", "trl-default", "ours / TRL, both WITH gradient checkpointing (equal settings)"),
    ("ours", "trl-nogc", "ours / TRL, both WITHOUT gradient checkpointing (equal settings)"),
    ("ours", "trl-default", "ours as configured / TRL as shipped (what a user gets out of the box)"),
    ("ours-bf16", "ours", "bf16 / fp32, same work (ours, no checkpointing)"),
    ("ours", "ours-row", "one trajectory per micro-batch / one packed row per step (padding-free under SDPA)"),
    ("ours-padded", "ours", "padded rows / one trajectory per micro-batch"),
    ("ours-packing", "ours", "packed fixed-length rows / one trajectory per micro-batch"),
    ("ours-chunked", "ours", "TRL's chunked loss / the model's own loss"),
]


def records() -> list[dict]:
    from pipeline.core.trajectory import parse, render
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


def finetune_cfg(model: str, out: Path, steps: int, batch: int, checkpointing: bool, precision: str,
                 overrides: tuple[str, ...] = ()):
    from pipeline.core.config import load_config
    from pipeline.train.config import FinetuneConfig, resolve
    base = ["init=random", "tokenizer=smollm2", "student=tiny", "learning_rate=1.0e-3"] if model == "tiny" else [
        "student=smollm2", "learning_rate=2.0e-5"]
    return resolve(load_config(FinetuneConfig, None, base + [
        f"max_steps={steps}", f"global_batch_size={batch}", f"precision={precision}",
        f"gradient_checkpointing={str(checkpointing).lower()}",
        "report_to=none", "save_steps=100000", f"output_root={out}", "logging_steps=1000", "lr_scheduler=constant",
        "warmup_ratio=0.0", *(o.format(batch=batch) for o in overrides)]))


def run_setup(name: str, model_name: str, recs: list[dict], steps: int, batch: int, out: Path) -> dict:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from pipeline.train.data import load_tokenizer
    from pipeline.train.model import load_student
    from pipeline.train.plan import plan_training
    from pipeline.train.sft import tokenize_records
    from pipeline.train.trainer import build_trainer, model_loss_trainer_class

    trainer_kind, checkpointing, precision, overrides = SETUPS[name]
    cfg = finetune_cfg(model_name, out / name, steps, batch, checkpointing, precision, overrides)
    tokenizer = load_tokenizer(cfg)
    plan = plan_training(cfg)  # one process
    timer = step_timer()
    if trainer_kind == "ours":
        # the trainer pipeline.train builds (batching, loss, precision as configured), its collator wrapped to count
        examples, report = tokenize_records(recs, tokenizer)
        accum = plan.batch.grad_accum
        trainer = build_trainer(cfg, plan, examples, tokenizer, report.max_length, callbacks=[timer])
        collator = CountingCollator(trainer.data_collator, tokenizer.pad_token_id)
        trainer.data_collator = collator
        model = trainer.model
    else:
        accum = 1
        model = load_student(cfg, tokenizer, plan)
        # TRL's defaults: only the run length, batch, output and fp32 are set (and, for trl-nogc,
        # checkpointing off; TRL 1.16 / transformers 5.24 call it activation_checkpointing).
        names = {f.name for f in dataclasses.fields(SFTConfig)}
        gc_key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
        extra = {} if checkpointing else {gc_key: False}
        args = SFTConfig(output_dir=str(out / name), max_steps=steps, per_device_train_batch_size=batch,
                         learning_rate=cfg.learning_rate, lr_scheduler_type="constant", report_to=[],
                         save_strategy="no", bf16=False, logging_steps=1000, seed=cfg.seed, data_seed=cfg.seed,
                         dataloader_pin_memory=False, **extra)
        assert getattr(args, gc_key) is checkpointing
        data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in recs])
        trainer_class = model_loss_trainer_class() if trainer_kind == "trl+loss" else SFTTrainer
        trainer = trainer_class(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                                callbacks=[timer])
        collator = CountingCollator(trainer.data_collator, tokenizer.pad_token_id)
        trainer.data_collator = collator
    assert trainer.accelerator.mixed_precision == ("bf16" if precision == "bf16" else "no")
    trainer.train()
    timed = collator.batches[accum:steps * accum]  # step 1 (its `accum` micro-batches) warms up
    seconds = sum(timer.durations[1:])
    real = sum(r for r, _ in timed)
    positions = sum(p for _, p in timed)
    params = sum(p.numel() for p in model.parameters())
    # the Trainer calls on_step_begin / on_step_end once per optimizer step (all its micro-batches)
    return {"setup": name, "tokens_per_s": real / seconds, "s_per_step": seconds / max(1, len(timer.durations) - 1),
            "padding_waste": 1 - real / positions, "real_tokens": real, "params": params,
            "precision": precision, "micro_batches": f"{len(collator.batches) // steps} per step"}


def report_model(model_name: str, runs: dict[str, list[dict]], limits: dict[str, float]) -> None:
    print(f"\n{model_name}: median [min-max] over repeats; {load_average()}")
    for name, results in runs.items():
        tps = [r["tokens_per_s"] for r in results]
        gflops = 6 * results[0]["params"] * statistics.median(tps) / 1e9
        precision = results[0]["precision"]
        print(f"  {name:12s} {spread(tps)} tokens/s  {statistics.median(r['s_per_step'] for r in results):6.2f} s/step  "
              f"padding waste {100 * results[0]['padding_waste']:4.1f}%  model {gflops:.2f} GFLOP/s = "
              f"{100 * gflops / limits[precision]:.1f}% of the {precision} matmul limit, "
              f"{100 * gflops / max(limits.values()):.1f}% of the machine's best", flush=True)
    for num, den, what in RATIOS:
        if num in runs and den in runs:
            ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[num], runs[den], strict=True)]
            print(f"  {num} / {den} = {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]: {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny"], choices=["tiny", "smollm2"])
    parser.add_argument("--steps", type=int, default=6, help="steps per setup and repeat; the first is not timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--setups", nargs="+", default=["trl-default", "trl-nogc", "ours-gc", "ours", "ours-bf16"],
                        choices=list(SETUPS))
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from pipeline.core import precision
    recs = records()
    print(f"data: {len(recs)} FireAct ReAct trajectories; batch {args.batch}; {args.steps} steps x "
          f"{args.repeats} repeats per setup; torch threads {torch.get_num_threads()}; "
          f"{precision.training('auto').line('auto would choose')}")
    limits = compute_limits()
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models:
            runs: dict[str, list[dict]] = {name: [] for name in args.setups}
            for repeat in range(args.repeats):
                order = args.setups[repeat % len(args.setups):] + args.setups[:repeat % len(args.setups)]
                for setup in order:
                    res = run_setup(setup, model_name, recs, args.steps, args.batch, Path(tmp) / f"{model_name}-{repeat}")
                    runs[setup].append(res)
                    print(f"{model_name:8s} repeat {repeat + 1} {setup:12s} {res['tokens_per_s']:9.1f} tokens/s  "
                          f"{res['s_per_step']:7.2f} s/step  ({res['real_tokens']} tokens timed; "
                          f"load {os.getloadavg()[0]:.2f})", flush=True)
            report_model(model_name, runs, limits)
    compute_limits()  # again at the end: did the machine's speed change during the run?
    return 0


if __name__ == "__main__":
    sys.exit(main())
