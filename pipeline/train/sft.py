"""One SFT example -> token ids and labels; the batch-size arithmetic of a launch.

The student is trained to decode the whole rendered trajectory (pipeline.core.trajectory.render)
conditioned on the question line alone, exactly as it is prompted at evaluation:

    prompt      "Question: ...\\n"                       labels -100 (never in the loss)
    completion  "Thought 1: ...\\nAction 1: ...\\n..."    labels = input ids
    EOS         tokenizer.eos_token_id                    in the loss, so the model learns to stop

The prompt and the completion are tokenised separately, the way the evaluator sees them (it
tokenises the prompt and the model continues), so no token straddles the boundary.
With `mask_observations=True`, every completion token whose characters overlap an observation
span (char offsets from the SFT dataset, mapped through the tokenizer's offset mapping) is
masked too; the paper trains on observations, so the default is False.

Nothing is ever truncated here: `max_length=None` sizes the batch from the longest example; a
given `max_length` drops longer examples (counted and reported) or raises, as configured.

    python -c "from pipeline.train.sft import split_batch; print(split_batch(64, 2, None, 8))"
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.core.errors import PipelineError

IGNORE_INDEX = -100


def tokenize_example(tokenizer: Any, prompt: str, completion: str,
                     observation_spans: Sequence[Sequence[int]] = (),
                     mask_observations: bool = False) -> dict[str, list[int]]:
    """Token ids and labels for one (prompt, completion) pair; EOS appended and trained."""
    if tokenizer.eos_token_id is None:
        raise PipelineError("the student's tokenizer has no EOS token; set one (tokenizer.eos_token) so the model can learn to stop")
    # A BOS token (Llama-3 adds <|begin_of_text|>) belongs to the prompt, as at generation time.
    prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    encoded = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
    completion_ids = list(encoded["input_ids"])
    labels = list(completion_ids)
    if mask_observations and observation_spans:
        for i, (start, end) in enumerate(encoded["offset_mapping"]):
            if _overlaps(start, end, observation_spans):
                labels[i] = IGNORE_INDEX
    input_ids = list(prompt_ids) + completion_ids + [tokenizer.eos_token_id]
    labels = [IGNORE_INDEX] * len(prompt_ids) + labels + [tokenizer.eos_token_id]
    return {"input_ids": input_ids, "labels": labels}


def tokenize_messages(tokenizer: Any, record: dict, n: int = 0) -> dict[str, list[int]]:
    """Token ids and labels for one row of the messages layout (pipeline/core/messages.py): the
    conversation under the tokenizer's chat template, with the `tools`; the template's
    {% generation %} marks decide the loss, as TRL's assistant_only_loss does: the assistant's
    turns (thoughts, tool calls, the end-of-turn token) in, the question, the tool schemas and
    every tool result out."""
    if not isinstance(record.get("messages"), list):
        raise PipelineError(f"SFT record {n} (id {record.get('id')!r}) has no 'messages' list; re-run `filter`")
    encoded = tokenizer.apply_chat_template(record["messages"], tools=record.get("tools") or None, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
    input_ids, mask = list(encoded["input_ids"]), list(encoded["assistant_masks"])
    if not any(mask):
        raise PipelineError(f"SFT record {n} (id {record.get('id')!r}): the chat template marks no assistant token; "
                            "it needs {% generation %} around the assistant's turns")
    return {"input_ids": input_ids, "labels": [t if m else IGNORE_INDEX for t, m in zip(input_ids, mask, strict=True)]}


def _overlaps(start: int, end: int, spans: Sequence[Sequence[int]]) -> bool:
    # A token such as " Badr" starts one character before its span (the space): any overlap
    # counts, since the model must not be trained to produce any part of an observation.
    return any(start < s_end and s_start < end for s_start, s_end in spans)


@dataclass
class LengthReport:
    """What tokenisation did to a dataset: lengths, and what max_length excluded."""

    n_examples: int = 0
    n_kept: int = 0
    n_too_long: int = 0
    max_length: int = 0  # the limit applied (the longest kept example when none was given)
    too_long_ids: list[str] = field(default_factory=list)
    tokens: int = 0  # tokens in kept examples
    trainable_tokens: int = 0  # labels != -100 in kept examples
    min: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p95: float = 0.0
    max: int = 0  # the longest example seen (kept or not)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        text = (f"{self.n_kept}/{self.n_examples} examples, {self.tokens} tokens "
                f"({self.trainable_tokens} in the loss); length min {self.min} mean {self.mean:.0f} "
                f"p95 {self.p95:.0f} max {self.max}; max_length {self.max_length}")
        if self.n_too_long:
            text += f"; DROPPED {self.n_too_long} longer than max_length (ids: {', '.join(self.too_long_ids[:5])}{' ...' if self.n_too_long > 5 else ''})"
        return text


def tokenize_records(records: Iterable[dict], tokenizer: Any, *, mask_observations: bool = False,
                     max_length: int | None = None, long_examples: str = "drop",
                     ) -> tuple[list[dict[str, list[int]]], LengthReport]:
    """Tokenise SFT dataset records (docs/formats.md: prompt, completion, observation_spans, id).

    `max_length=None`: keep everything (the longest example sets the length). Otherwise examples
    longer than it are dropped and reported (`long_examples="drop"`) or refused ("error")."""
    if long_examples not in ("drop", "error"):
        raise PipelineError(f"long_examples must be 'drop' or 'error', got {long_examples!r}")
    examples, lengths, report = [], [], LengthReport()
    for n, record in enumerate(records):
        if "messages" in record:  # the messages layout (messages.jsonl)
            example = tokenize_messages(tokenizer, record, n)
        else:
            for key in ("prompt", "completion"):
                if not isinstance(record.get(key), str):
                    raise PipelineError(f"SFT record {n} (id {record.get('id')!r}) has no '{key}' string; re-run `filter`")
            example = tokenize_example(tokenizer, record["prompt"], record["completion"],
                                       record.get("observation_spans") or (), mask_observations)
        length = len(example["input_ids"])
        lengths.append(length)
        report.n_examples += 1
        if max_length is not None and length > max_length:
            if long_examples == "error":
                raise PipelineError(
                    f"SFT record {n} (id {record.get('id')!r}) is {length} tokens, over max_length={max_length}; "
                    "raise max_length (or unset it to size from the data), or set long_examples=drop")
            report.n_too_long += 1
            report.too_long_ids.append(str(record.get("id", n)))
            continue
        examples.append(example)
        report.tokens += length
        report.trainable_tokens += sum(1 for x in example["labels"] if x != IGNORE_INDEX)
    report.n_kept = len(examples)
    if lengths:
        ordered = sorted(lengths)
        report.min, report.max = ordered[0], ordered[-1]
        report.mean = statistics.fmean(ordered)
        report.p50 = float(statistics.median(ordered))
        report.p95 = float(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))])
    kept_max = max((len(e["input_ids"]) for e in examples), default=0)
    report.max_length = max_length if max_length is not None else kept_max
    return examples, report


def split_batch(global_batch_size: int, num_processes: int, per_device_batch_size: int | None = None,
                max_per_device_batch_size: int = 8, batch_name: str = "global_batch_size") -> tuple[int, int]:
    """global = per_device x grad_accum x processes -> (per_device, grad_accum).

    With `per_device_batch_size=None` the largest divisor of global/processes that is at most
    `max_per_device_batch_size` is taken (fewest accumulation steps that fit in memory).
    `batch_name`: what the caller's config calls the global batch, for the error lines."""
    if global_batch_size < 1 or num_processes < 1 or max_per_device_batch_size < 1:
        raise PipelineError(f"{batch_name} ({global_batch_size}), the number of processes ({num_processes}) and "
                            f"max_per_device_batch_size ({max_per_device_batch_size}) must be >= 1")
    if global_batch_size % num_processes:
        raise PipelineError(
            f"{batch_name}={global_batch_size} does not divide over {num_processes} processes "
            f"({global_batch_size}/{num_processes} = {global_batch_size / num_processes:g}); use a multiple of {num_processes}")
    per_process = global_batch_size // num_processes
    if per_device_batch_size is None:
        per_device_batch_size = max(d for d in range(1, min(per_process, max_per_device_batch_size) + 1)
                                    if per_process % d == 0)
    if per_device_batch_size < 1 or per_process % per_device_batch_size:
        raise PipelineError(
            f"{batch_name}={global_batch_size} = per_device_batch_size x gradient accumulation x {num_processes} processes "
            f"is impossible with per_device_batch_size={per_device_batch_size} ({per_process} per process is not a multiple "
            f"of {per_device_batch_size}); pick a divisor of {per_process}")
    return per_device_batch_size, per_process // per_device_batch_size
