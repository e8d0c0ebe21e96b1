"""GRPO steps of the 135M student on this CPU: the path before (fp32 rollouts in groups of 8, TRL's
micro-batches padded to the step's longest rollout) against the new one (bf16 rollouts, all of a
step's at once, micro-batches regrouped by length and trimmed), one process, interleaved.

    .venv/bin/python bench/bench_grpo_step.py                        # 2 steps of 2 questions x 8 rollouts
    .venv/bin/python bench/bench_grpo_step.py --steps 1 --group-size 4 --episode-steps 3   # a few minutes

One real GRPOTrainer (pipeline.rl.train.build_trainer: SmolLM2-135M-Instruct, the embedded model
the tests use, full fine-tuning, precision auto; the offline-bootstrap questions in the offline
26k-page index, ReAct, T = 0.7, as configs/grpo/smollm2-135m-round3.yaml) runs each step twice from
the same weights and optimizer state (restored between): once per path, the order alternating
step by step (old-new, new-old, ...) so load changes hit both. A step is TRL's own: the trainer's
training_step over every micro-batch (the first generates and scores the rollouts), then gradient
clipping and the optimizer's step. Printed per step and path: seconds in rollouts (the rollout
function's own clock), in the rest (scoring and the update), the rollouts' tokens and the padded
tokens the update ran; then the medians, and the replay check: the old path's scored rollouts of
the first step through the update in fp32 (autocast off), TRL's padded micro-batches against the
regrouped and trimmed ones, from the same weights: the step's loss and gradient norm must agree
within 1e-5 (the gradient norm relative to its size). Where every group's rewards were equal (an
untrained student rarely finishes: loss and gradient 0 either way) the replay gives the rollouts
advantages of +1 and -1 in turn, the same in both layouts, and says so. Rollouts differ between the paths (bf16 and fp32 sample
different tokens from the same seeds), so their episode lengths do too: the tokens are printed.
The load average goes with every line. The last line is `RATIO grpo step new/old = X`: the
median over steps of old seconds / new seconds per step (above 1: the new path is faster).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import load_average  # noqa: E402

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki" / "corpus.jsonl"
REPLAY_TOLERANCE = 1e-5
PATHS = {  # name: (rollout dtype, rollouts per decoding batch (None: the step's), trimmed micro-batches)
    "old": ("fp32", 8, False),
    "new": ("bf16", None, True),
}


def cpu_line() -> str:
    from pipeline.core.precision import cpu_bf16, cpu_flags

    flags = sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx2")))
    return f"CPU flags: {' '.join(flags) or 'none of avx2 / avx512 / amx'}; native bf16: {cpu_bf16()[1]}"


def build(args, out: Path):
    """The trainer of the benchmark's run and its generation batches."""
    from pipeline.core.config import load_config
    from pipeline.rl.config import GrpoConfig, resolve
    from pipeline.rl.plan import plan_grpo
    from pipeline.rl.train import build_trainer
    from pipeline.train.checks import Layout
    from pipeline.wiki.index import build_index

    index = out / "index.sqlite"
    build_index([CORPUS], index)
    cfg = resolve(load_config(GrpoConfig, None, [
        "student=smollm2", "questions=offline-bootstrap", f"wiki.index={index}", f"output_root={out}",
        f"questions_per_step={args.questions_per_step}", f"group_size={args.group_size}",
        f"per_device_batch_size={args.per_device}", f"max_steps={args.steps}", f"prompting.max_steps={args.episode_steps}",
        f"prompting.max_new_tokens={args.max_new_tokens}", "prompting.temperature=0.7", "learning_rate=1e-5",
        "reward.format=0.1", "log_rollouts=false", f"seed={args.seed}"]))
    plan = plan_grpo(cfg, 1)
    layout = Layout(1, plan.batch.per_device, plan.batch.grad_accum, cfg.rollouts_per_step, "plain",
                    len(plan.questions.rows))
    trainer, _ = build_trainer(plan, layout)
    trainer.create_optimizer()
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = plan.batch.grad_accum
    return trainer, cfg, plan


def snapshot(trainer) -> tuple[dict, dict]:
    model = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return model, copy.deepcopy(trainer.optimizer.state_dict())


def restore(trainer, state: tuple[dict, dict]) -> None:
    trainer.model.load_state_dict(state[0])
    trainer.optimizer.load_state_dict(copy.deepcopy(state[1]))


def set_path(trainer, name: str, rollouts_per_step: int) -> None:
    dtype, batch, trim = PATHS[name]
    trainer.rollout_func.sample_dtype = dtype
    trainer.rollout_func.max_batch_size = batch or rollouts_per_step
    trainer.trim_micro_batches = trim


def one_step(trainer, batch, step: int, max_grad_norm: float) -> dict:
    """TRL's training_step over the step's micro-batches (the first generates), then the optimizer."""
    import torch

    counts = []
    trainer.rollout_func.on_counts = counts.append
    trainer.state.global_step, trainer._step, trainer._buffered_inputs = step, 0, None
    trainer.optimizer.zero_grad(set_to_none=True)
    started = time.perf_counter()
    loss = sum(trainer.training_step(trainer.model, batch, None).item()
               for _ in range(trainer.current_gradient_accumulation_steps))
    norm = float(torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), max_grad_norm))
    trainer.optimizer.step()
    seconds = time.perf_counter() - started
    [rollout] = counts
    padded = sum(b["prompt_ids"].numel() + b["completion_ids"].numel() for b in trainer._buffered_inputs)
    return {"seconds": seconds, "rollouts": rollout.seconds, "update": seconds - rollout.seconds, "loss": loss,
            "grad_norm": norm, "tokens": sum(rollout.trained), "generated": rollout.generated, "padded": padded,
            "prefill": rollout.prefill,
            "micro_batches": list(trainer._buffered_inputs)}


def replay(trainer, state, micro_batches: list[dict], max_grad_norm: float) -> dict:
    """(loss, gradient norm) of the same scored rollouts, padded as TRL splits them and regrouped
    and trimmed, each from `state`, in fp32 (accelerate's autocast off)."""
    import torch

    from pipeline.rl import microbatch

    out = {"advantages": "the step's own"}
    if all(not b["advantages"].any() for b in micro_batches):
        # Every group's rewards were equal (the untrained student rarely finishes): the loss and gradient would be 0
        # in both layouts. The replay then gives the rollouts advantages of +1 and -1 in turn, the same to both.
        micro_batches = [dict(b) for b in micro_batches]
        start = 0
        for b in micro_batches:
            n = len(b["advantages"])
            b["advantages"] = torch.tensor([1.0 if (start + i) % 2 == 0 else -1.0 for i in range(n)])
            start += n
        out["advantages"] = "+1 and -1 in turn (the step's rewards were all equal)"
    regrouped = microbatch.regroup(micro_batches, microbatch.pairing_keeps_the_loss(trainer))
    amp, trainer.accelerator.native_amp = trainer.accelerator.native_amp, False
    try:
        for name, batches in (("padded", micro_batches), ("trimmed", regrouped)):
            restore(trainer, state)
            trainer.optimizer.zero_grad(set_to_none=True)
            loss = 0.0
            for inputs in batches:
                with trainer.compute_loss_context_manager():
                    step_loss = trainer.compute_loss(trainer.model, inputs)
                step_loss.backward()
                loss += step_loss.item()
            norm = float(torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), max_grad_norm))
            out[name] = (loss, norm)
    finally:
        trainer.accelerator.native_amp = amp
    return out


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps, each run by both paths")
    parser.add_argument("--questions-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--per-device", type=int, default=2, help="rollouts per forward/backward (the configs' 2)")
    parser.add_argument("--episode-steps", type=int, default=7, help="ReAct steps per episode at most")
    parser.add_argument("--max-new-tokens", type=int, default=100, help="tokens per ReAct step at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-replay", action="store_true", help="skip the fp32 replay check")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # a machine shared with other jobs: two threads each can wait on each other

    print(cpu_line())
    print(f"{torch.get_num_threads()} torch threads; {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        trainer, cfg, plan = build(args, Path(tmp))
        per_step = cfg.rollouts_per_step
        print(f"SmolLM2-135M, {cfg.questions_per_step} questions x {cfg.group_size} rollouts per step, "
              f"{plan.batch.per_device} per micro-batch x {plan.batch.grad_accum}, ReAct <= {args.episode_steps} steps x "
              f"{args.max_new_tokens} tokens, training precision {'bf16' if trainer.args.bf16 else 'fp32'}", flush=True)
        batches = iter(trainer.get_train_dataloader())
        results: dict[str, list[dict]] = {name: [] for name in PATHS}
        check = None
        for step in range(args.steps):
            batch = next(batches)
            state = snapshot(trainer)
            order = list(PATHS) if step % 2 == 0 else list(reversed(PATHS))
            for name in order:
                restore(trainer, state)
                set_path(trainer, name, per_step)
                r = one_step(trainer, batch, step, cfg.max_grad_norm)
                results[name].append(r)
                print(f"step {step + 1} {name}: {r['seconds']:6.1f} s = rollouts {r['rollouts']:6.1f} s + update "
                      f"{r['update']:6.1f} s; {r['tokens']} rollout tokens ({r['generated']} sampled, {r['prefill']} context "
                      "tokens read), "
                      f"{r['padded']} in the update's micro-batches; loss {r['loss']:+.5f}, grad norm "
                      f"{r['grad_norm']:.4f}; {load_average()}", flush=True)
            if check is None and not args.no_replay:
                after = snapshot(trainer)  # the step's result, to go on from after the replay
                check = replay(trainer, state, results["old"][-1]["micro_batches"], cfg.max_grad_norm)
                check["step"] = step + 1
                restore(trainer, after)
            for name in PATHS:
                results[name][-1].pop("micro_batches")
        print(f"\nmedians over {args.steps} steps; {load_average()}")
        for name in PATHS:
            rs = results[name]
            print(f"  {name}: {statistics.median(r['seconds'] for r in rs):6.1f} s/step = rollouts "
                  f"{statistics.median(r['rollouts'] for r in rs):6.1f} s + update {statistics.median(r['update'] for r in rs):6.1f} s"
                  f"; rollout tokens {statistics.median(r['tokens'] for r in rs):.0f}, update tokens with padding "
                  f"{statistics.median(r['padded'] for r in rs):.0f}")
        ratios = [o["seconds"] / n["seconds"] for o, n in zip(results["old"], results["new"], strict=True)]
        rollout = [o["rollouts"] / n["rollouts"] for o, n in zip(results["old"], results["new"], strict=True)]
        update = [o["update"] / n["update"] for o, n in zip(results["old"], results["new"], strict=True)]
        print(f"  old/new per step: {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]; rollouts "
              f"{statistics.median(rollout):.2f}x, update {statistics.median(update):.2f}x")
        # bf16 and fp32 sample different episodes from the same seeds: per token, their lengths drop out
        sampled = [(n["generated"] / n["rollouts"]) / (o["generated"] / o["rollouts"])
                   for o, n in zip(results["old"], results["new"], strict=True)]
        trained = [(n["tokens"] / n["update"]) / (o["tokens"] / o["update"])
                   for o, n in zip(results["old"], results["new"], strict=True)]
        print(f"  per token, new/old: rollouts' sampled tokens/s {statistics.median(sampled):.2f}x "
              f"[{min(sampled):.2f}-{max(sampled):.2f}], update's rollout tokens/s {statistics.median(trained):.2f}x "
              f"[{min(trained):.2f}-{max(trained):.2f}]")
        ok = True
        if check is None:
            print("replay: NOT CHECKED (--no-replay)")
        else:
            (loss_a, norm_a), (loss_b, norm_b) = check["padded"], check["trimmed"]
            ok = abs(loss_a - loss_b) <= REPLAY_TOLERANCE and abs(norm_a - norm_b) <= REPLAY_TOLERANCE * max(1.0, norm_a)
            print(f"replay of step {check['step']}'s old rollouts in fp32: loss padded {loss_a:+.8f} trimmed {loss_b:+.8f} "
                  f"(diff {abs(loss_a - loss_b):.2e}); grad norm padded {norm_a:.8f} trimmed {norm_b:.8f} "
                  f"(diff {abs(norm_a - norm_b):.2e}): {'EQUAL' if ok else 'DIFFERENT'} within {REPLAY_TOLERANCE:g}; "
                  f"advantages {check['advantages']}")
    print(f"RATIO grpo step new/old = {statistics.median(ratios):.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
