"""One rollout's tokens: what the policy sampled (in the loss) and what the loop wrote (masked).

The episode program (pipeline.methods.interactive) builds every prompt as prefix +
render(trajectory so far) + the step's cue, so the text the policy reads is the renderer's text,
the same text its SFT data was. A trace keeps that text as token ids, one segment at a time:

    prompt ids      tokenizer(question line)               TRL's prompt_ids
    env segment     "Thought 1:"                           mask 0 (the loop wrote it)
    policy segment  " I need ...\\nAction 1: Search[x]\\nObservation 1:"   mask 1 (sampled)
    env segment     " <observation>\\nThought 2:"           mask 0
    ...
    env segment     the renderer's end of the episode, then EOS   mask 0

Each policy segment is exactly the token ids the policy sampled, in exactly the context it was
sampled in, so its log-probabilities in the loss are the sampling distribution's. When the
loop's next prompt does not extend the text so far (the policy wrote two spaces, a second
line after its action, or no action: the loop keeps what the renderer keeps), the trace drops
tokens from its end until its text is a prefix of the prompt, then appends the rest as loop
text: the kept tokens keep their context, the dropped ones are counted (`dropped_policy_tokens`)
and never trained. So the decoded completion is always the renderer's text, character for
character: the student's RL format and its SFT format are one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.core.errors import PipelineError


@dataclass
class TokenTrace:
    tokenizer: Any
    prompt: str  # the question line (with any instruction prefix): TRL's prompt
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # the completion's token ids
    mask: list[int] = field(default_factory=list)  # 1: sampled by the policy (in the loss), 0: the loop's
    # The sampling engine's log-probability of each token, beside `ids`: the policy's own where the engine
    # gave one (None where it gave none), 0.0 at the loop's tokens (masked, as TRL's own tool loop does).
    # TRL's vLLM importance-sampling correction divides the trainer's probabilities by these.
    logprobs: list[float | None] = field(default_factory=list)
    dropped_policy_tokens: int = 0
    generated_tokens: int = 0  # every token the policy sampled, kept or dropped

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            # As SFT tokenises its prompt (pipeline.train.sft.tokenize_example): special tokens (BOS) included.
            self.prompt_ids = list(self.tokenizer(self.prompt, add_special_tokens=True)["input_ids"])

    @property
    def text(self) -> str:
        """The completion so far. Special tokens are kept: one the policy sampled mid-episode
        (which the loop's text never holds) is dropped like any other stray token."""
        return self.tokenizer.decode(self.ids, skip_special_tokens=False)

    def context(self, request_prompt: str) -> list[int]:
        """The token ids the policy continues for `request_prompt` (prompt + completion so far),
        after bringing the completion up to the text the loop asks with."""
        if not request_prompt.startswith(self.prompt):
            raise PipelineError("rollout: a request does not start with its episode's prompt "
                                "(the method's prompts must extend the question line)")
        self.extend_to(request_prompt[len(self.prompt):])
        return self.prompt_ids + self.ids

    def extend_to(self, target: str) -> None:
        """Make the completion's text equal `target`: keep the longest prefix of tokens whose
        text is a prefix of it, append the rest as the loop's (masked) tokens."""
        text = self.text
        while self.ids and not target.startswith(text):
            self.dropped_policy_tokens += self.mask.pop()
            self.ids.pop()
            self.logprobs.pop()
            text = self.text
        if not target.startswith(text):  # nothing left to drop: the prompt itself is not a prefix
            raise PipelineError(f"rollout: cannot rebuild the loop's text {target[:60]!r}")
        rest = target[len(text):]
        if rest:
            self.ids += self.tokenizer(rest, add_special_tokens=False)["input_ids"]
            self.mask += [0] * (len(self.ids) - len(self.mask))
            self.logprobs += [0.0] * (len(self.ids) - len(self.logprobs))
        text = self.text
        if text != target:
            at = next((i for i, (a, b) in enumerate(zip(text, target, strict=False)) if a != b),
                      min(len(text), len(target)))
            raise PipelineError(
                f"rollout: the tokenizer does not give back the loop's text from its tokens ({text[at:at + 30]!r} "
                f"where the text has {target[at:at + 30]!r}); GRPO's token trace needs a tokenizer that encodes any "
                "text losslessly and decodes pieces tokenised apart as their concatenation (byte-level BPE: "
                "Llama-3, Qwen2.5, SmolLM2; SentencePiece with byte fallback: Gemma 3)")

    def add_policy(self, token_ids: list[int], logprobs: list[float | None] | None = None) -> None:
        """Tokens the policy sampled for the last context (EOS excluded: the loop goes on), with
        the engine's log-probability of each where it gave them."""
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise PipelineError(f"rollout: {len(logprobs)} log-probabilities for {len(token_ids)} sampled tokens")
        self.ids += list(token_ids)
        self.mask += [1] * len(token_ids)
        self.logprobs += list(logprobs) if logprobs is not None else [None] * len(token_ids)
        self.generated_tokens += len(token_ids)

    def finish(self, final_completion: str, eos_token_id: int) -> None:
        """End on the renderer's whole completion and EOS (masked: the loop, not the policy,
        ends an episode; SFT data ends the same way)."""
        self.extend_to(final_completion)
        self.ids.append(eos_token_id)
        self.mask.append(0)
        self.logprobs.append(0.0)
