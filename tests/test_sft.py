"""Token-by-token checks of the SFT labels with the real SmolLM2 tokenizer; no truncation; the
batch-size arithmetic.   .venv/bin/python -m pytest tests/test_sft.py"""

from __future__ import annotations

import pytest
from sft_testdata import DATA, exemplar_records, fireact_records

from pipeline.core.errors import PipelineError
from pipeline.train.sft import IGNORE_INDEX, split_batch, tokenize_example, tokenize_records

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent")


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def records():
    # ReAct (observations), Act, CoT and Standard exemplars from the paper + FireAct trajectories
    recs = [r for m in ("react", "act", "cot", "standard") for r in exemplar_records(m)]
    return recs + fireact_records(limit=20)


def completion_offsets(tokenizer, completion):
    return tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]


def check_common(tokenizer, rec, example):
    ids, labels = example["input_ids"], example["labels"]
    n_prompt = len(tokenizer(rec["prompt"], add_special_tokens=True)["input_ids"])
    assert len(ids) == len(labels)
    # every trainable label is the input id at that position (the model shifts internally)
    assert all(lab == tok for lab, tok in zip(labels, ids, strict=True) if lab != IGNORE_INDEX)
    assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt, "prompt must be masked"
    assert tokenizer.decode(ids[:n_prompt]) == rec["prompt"]
    assert tokenizer.decode(ids[n_prompt:-1]) == rec["completion"], "completion tokens must round-trip"
    assert ids[-1] == tokenizer.eos_token_id and labels[-1] == tokenizer.eos_token_id, "EOS must be in the loss"
    return n_prompt


def test_paper_default_trains_every_completion_token(tokenizer, records):
    for rec in records:
        example = tokenize_example(tokenizer, rec["prompt"], rec["completion"], rec["observation_spans"])
        n_prompt = check_common(tokenizer, rec, example)
        # observations included: every completion token (and EOS) is in the loss
        assert example["labels"][n_prompt:] == example["input_ids"][n_prompt:]


def test_mask_observations_masks_exactly_the_observation_tokens(tokenizer, records):
    n_masked_total = 0
    for rec in records:
        spans = rec["observation_spans"]
        example = tokenize_example(tokenizer, rec["prompt"], rec["completion"], spans, mask_observations=True)
        n_prompt = check_common(tokenizer, rec, example)
        completion_labels = example["labels"][n_prompt:-1]
        offsets = completion_offsets(tokenizer, rec["completion"])
        assert len(offsets) == len(completion_labels)
        covered = [False] * len(rec["completion"])  # chars covered by masked tokens
        for (start, end), label, tok in zip(offsets, completion_labels, example["input_ids"][n_prompt:-1], strict=True):
            inside = [s for s in spans if start < s[1] and s[0] < end]
            if inside:
                assert label == IGNORE_INDEX, f"observation token {rec['completion'][start:end]!r} is in the loss"
                covered[start:end] = [True] * (end - start)
                n_masked_total += 1
            else:
                assert label == tok, f"non-observation token {rec['completion'][start:end]!r} was masked"
        for s_start, s_end in spans:  # all of each observation's text is covered by masked tokens
            assert all(covered[s_start:s_end])
        if rec["method"] in ("react", "act"):
            assert spans, "ReAct/Act examples must carry observation spans"
            header = rec["completion"].index("Observation 1: ")
            assert not any(covered[header:header + len("Observation 1:")]), "the 'Observation i:' header stays trainable"
        else:  # standard / cot: nothing to mask, identical to the default
            assert example == tokenize_example(tokenizer, rec["prompt"], rec["completion"], spans)
    assert n_masked_total > 500


def test_nothing_is_truncated_silently(tokenizer, records):
    full, report = tokenize_records(records, tokenizer)
    lengths = [len(e["input_ids"]) for e in full]
    assert report.n_kept == report.n_examples == len(records) and report.n_too_long == 0
    assert report.max_length == max(lengths) == report.max  # sized from the data
    limit = sorted(lengths)[len(lengths) // 2]
    kept, report = tokenize_records(records, tokenizer, max_length=limit)
    n_long = sum(n > limit for n in lengths)
    assert n_long > 0 and report.n_too_long == n_long and report.n_kept == len(records) - n_long
    assert len(report.too_long_ids) == n_long and "DROPPED" in report.summary()
    # kept examples are whole, never cut
    assert kept == [e for e in full if len(e["input_ids"]) <= limit]
    with pytest.raises(PipelineError, match="over max_length"):
        tokenize_records(records, tokenizer, max_length=limit, long_examples="error")


def test_missing_fields_are_reported(tokenizer):
    with pytest.raises(PipelineError, match="no 'completion'"):
        tokenize_records([{"id": "x", "prompt": "Question: q\n"}], tokenizer)


@pytest.mark.parametrize("args, expected", [
    ((64, 1, None, 8), (8, 8)),
    ((64, 2, None, 8), (8, 4)),
    ((64, 8, None, 8), (8, 1)),
    ((64, 2, 16, 8), (16, 2)),
    ((64, 4, None, 6), (4, 4)),  # largest divisor of 16 that is <= 6
    ((8, 2, None, 8), (4, 1)),
])
def test_split_batch(args, expected):
    per_device, accum = split_batch(*args)
    assert (per_device, accum) == expected
    assert per_device * accum * args[1] == args[0]


@pytest.mark.parametrize("args, message", [
    ((64, 3, None, 8), r"global_batch_size=64 does not divide over 3 processes \(64/3 = 21.3333\)"),
    ((64, 2, 6, 8), r"impossible with per_device_batch_size=6 \(32 per process"),
    ((64, 0, None, 8), r"must be >= 1"),
])
def test_split_batch_errors(args, message):
    with pytest.raises(PipelineError, match=message):
        split_batch(*args)
