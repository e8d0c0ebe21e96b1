"""Throughput and MFU of a GRPO step: the rollouts' generation and the policy update together.

Per logged step, from the token counts of the rollouts (pipeline.rl.rollout.RolloutCounts) and
the step time (the same timing callback as SFT: pipeline.train.flops.ThroughputMeter):

    update      each rollout's prompt + completion, trained as SFT trains a sequence
                (pipeline.train.flops.flops_per_token: 6N + attention, LoRA 4N, + recompute)
    extra pass  one more forward over the same tokens for each of: TRL's old log-probs
                (num_iterations > 1) and the reference model (beta > 0)
    generation  2N per context token read and per token sampled (prefill counted whole each
                call: with the KV cache reused, an upper bound) + attention at the mean length

MFU = those FLOPs per second per device / the device's peak (pipeline/train/flops.py's table on
GPUs, `peak_tflops` elsewhere); without a peak only tokens/s and TFLOP/s are logged, as SFT does.
"""

from __future__ import annotations

from pipeline.rl.rollout import RolloutCounts
from pipeline.train.flops import (
    FlopsPerToken,
    ThroughputMeter,
    attention_length,
    flops_per_token,
    matmul_params,
)


class RolloutThroughput(ThroughputMeter):
    def __init__(self, model_config, *, full_finetuning: bool, checkpointing: bool, extra_forwards: int,
                 peak: float | None):
        super().__init__(FlopsPerToken(0.0, 0.0), processes=1, peak=peak)
        self.config, self.full, self.checkpointing = model_config, full_finetuning, checkpointing
        self.extra_forwards = extra_forwards
        self._flops = self._hardware = 0.0
        self._trained = self._generated = 0

    def add(self, counts: RolloutCounts) -> None:
        """One rollout batch of this process (called by the rollout function)."""
        if not counts.trained:
            return
        length = attention_length(counts.trained)
        train = flops_per_token(self.config, full_finetuning=self.full, checkpointing=self.checkpointing,
                                attention_length=length)
        tokens = sum(counts.trained)
        forward = 2 * matmul_params(self.config) + 4 * self.config.num_hidden_layers * self._attention_width() * length
        extra = self.extra_forwards * forward * tokens
        generation = 2 * matmul_params(self.config) * (counts.prefill + counts.generated) \
            + 4 * self.config.num_hidden_layers * self._attention_width() * length / 2 * counts.generated
        self._flops += train.model * tokens + extra + generation
        self._hardware += train.hardware * tokens + extra + generation
        self._trained += tokens
        self._generated += counts.generated

    def end_warm_up(self, tokens_seen: int) -> None:
        """The first step's rollouts are warm-up too: its FLOPs and tokens leave the figures
        with its time (pipeline.train.flops.ThroughputMeter)."""
        super().end_warm_up(tokens_seen)
        self._flops = self._hardware = 0.0
        self._trained = self._generated = 0

    def _attention_width(self) -> int:
        heads = self.config.num_attention_heads
        return (getattr(self.config, "head_dim", None) or self.config.hidden_size // heads) * heads

    def metrics(self, tokens_seen: int = 0) -> dict[str, float]:
        """Figures since the last call, for this device (every process logs its own rollouts)."""
        if self._seconds <= 0 or self._trained <= 0:
            return {}
        out = {"tokens_per_s_per_device": round(self._trained / self._seconds, 1),
               "generated_tokens_per_s_per_device": round(self._generated / self._seconds, 1),
               "tflops_per_device": round(self._flops / self._seconds / 1e12, 4)}
        if self.peak:
            out["mfu"] = round(self._flops / self._seconds / (self.peak * 1e12), 4)
            out["hfu"] = round(self._hardware / self._seconds / (self.peak * 1e12), 4)
        self._seconds, self._flops, self._hardware, self._trained, self._generated = 0.0, 0.0, 0.0, 0, 0
        return out
