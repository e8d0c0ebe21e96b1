"""GRPO rollouts on a CPU: sampling from fp32 weights under bf16 autocast (what accelerate's
mixed-precision forward does) against without it (what pipeline.rl.policy does on a CPU), one
process, the same requests, the same seeds.

    .venv/bin/python bench/bench_rollout_autocast.py                    # SmolLM2-135M, batch 2
    .venv/bin/python bench/bench_rollout_autocast.py --batch 8 --tokens 48 --repeats 3

Prints generated tokens/s for each and the ratio (without / with autocast) per repeat, plus the
load average (other work on the machine slows both; the ratio less). The decoding loop is the
project's (pipeline.llm.hf via pipeline.rl.policy.PolicyLLM), fed token ids as in a rollout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.hub.models import resolve_model_path
    from pipeline.llm.config import LLMConfig
    from pipeline.rl.policy import PolicyLLM, TokenRequest

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tokenizer("Question: Which magazine was started first, Arthur's Magazine or First for Women?\n"
                    "Thought 1:")["input_ids"]
    requests = [TokenRequest(prompt="", stop=["\nObservation 1:"], max_new_tokens=args.tokens, temperature=1.0,
                             seed=i, prompt_ids=ids) for i in range(args.batch)]

    def tokens_per_s(autocast: bool) -> float:
        policy = PolicyLLM.from_loaded(LLMConfig(model="policy", max_batch_size=args.batch), model, tokenizer)
        context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with context:
            started = time.perf_counter()
            out = policy.generate(requests)
            seconds = time.perf_counter() - started
        return sum(len(c[0].token_ids) for c in out) / seconds

    print(f"{args.model}, batch {args.batch}, {args.tokens} new tokens, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    for repeat in range(args.repeats):
        with_autocast, without = tokens_per_s(True), tokens_per_s(False)
        print(f"repeat {repeat + 1}: bf16 autocast {with_autocast:.1f} tok/s, fp32 {without:.1f} tok/s, "
              f"ratio {without / with_autocast:.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
