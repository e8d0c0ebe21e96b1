"""The `context_exceeded` end reason, driven end to end through `python -m pipeline generate`:
a real context overflow on a tiny transformers model, and the error bodies that real vLLM and
llama.cpp servers send back for an over-long request, served over HTTP on 127.0.0.1 to the
OpenAI-compatible backend. Only the episode that overflows ends that way; the others go on.

    .venv/bin/python -m pytest tests/test_context_overflow.py -q
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from episode_testdata import CORPUS, ScriptedTeacher, read_records, run_pipeline, write_questions
from http_servers import OVERFLOW_STYLES, FakeOpenAI, context_overflow

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")

WINDOW = 1024  # the tiny model's max_position_embeddings: Standard's 6-shot prompt fits, 1,500 more words do not


@pytest.fixture(scope="module")
def questions():
    from pipeline.tasks.hotpotqa.questions import load_question_set

    return load_question_set("offline-eval", limit=2)


@pytest.fixture(scope="module")
def tiny_short_context_model(tmp_path_factory, smollm2_dir) -> Path:
    """A random-weight tiny Llama built here, with the SmolLM2 tokenizer and a 1,024-token window."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, max_position_embeddings=WINDOW,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    folder = tmp_path_factory.mktemp("tiny-1024")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_prompt_longer_than_a_tiny_models_window_ends_that_episode_context_exceeded(
        tmp_path, index, questions, tiny_short_context_model, smollm2_dir):
    from transformers import AutoTokenizer

    long_question = dataclasses.replace(questions[1], question=" ".join([questions[1].question] * 100))
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert len(tokenizer(long_question.question).input_ids) > WINDOW  # it really cannot fit
    qfile = write_questions(tmp_path / "q.jsonl", [questions[0], long_question], ids=["fits", "too-long"])
    out = tmp_path / "out"
    proc = run_pipeline("generate", "teacher.backend=transformers", f"teacher.model={tiny_short_context_model}",
                        "teacher.device=cpu", f"questions={qfile}", f"wiki.index={index}", f"out_dir={out}",
                        "methods=[standard]", "prompting.max_new_tokens=4")
    assert proc.returncode == 0, proc.stderr
    records = {r["id"]: r for r in read_records(out / "standard.jsonl")}
    assert records["too-long"]["end_reason"] == "context_exceeded"
    assert records["too-long"]["prediction"] is None and records["too-long"]["em"] == 0.0
    # the short prompt was generated from: the model wrote tokens, whatever they say
    assert records["fits"]["end_reason"] != "context_exceeded" and records["fits"]["completion_tokens"] > 0


def test_the_overflow_bodies_are_those_of_the_real_servers():
    """Pins the fake's answers to vLLM's and llama.cpp's wording (see http_servers.py)."""
    assert context_overflow("vllm", 100, 10, 200) is None
    assert context_overflow("vllm", 195, 10, 200)["error"]["message"].startswith(
        "'max_tokens' or 'max_completion_tokens' is too large: 10. This model's maximum context length is 200")
    legacy = context_overflow("vllm-legacy", 300, 10, 200)
    assert legacy["object"] == "error" and legacy["message"] == (
        "This model's maximum context length is 200 tokens. However, your request has 300 input tokens. "
        "Please reduce the length of the input messages.")
    assert context_overflow("llama.cpp", 195, 10, 200) is None  # llama-server checks the prompt only
    assert context_overflow("llama.cpp", 300, 10, 200)["error"]["type"] == "exceed_context_size_error"


def test_real_servers_context_errors_end_the_episode_mid_trajectory(tmp_path, index, questions):
    """A ReAct episode whose first step fits the server's window and whose second (the prompt
    has grown by a thought, an action and an observation) does not: the server answers 400 with
    its real error body, the request is not retried, and the episode ends `context_exceeded`
    after its first step. Once per server flavour."""
    question = questions[0]
    qfile = write_questions(tmp_path / "q.jsonl", [question])
    with FakeOpenAI(model="served") as server:
        server.replies = ScriptedTeacher([question])
        args = ["generate", "teacher.backend=openai", "teacher.model=served", f"teacher.base_url={server.url}/v1",
                f"questions={qfile}", f"wiki.index={index}", "methods=[react]"]
        free = run_pipeline(*args, f"out_dir={tmp_path / 'no-limit'}")
        assert free.returncode == 0, free.stderr
        [fine] = read_records(tmp_path / "no-limit" / "react.jsonl")
        assert fine["end_reason"] == "finish" and fine["n_steps"] == 2
        first, second = (r.body for r in server.requests if r.path == "/v1/completions")
        words = len(first["prompt"].split())
        assert len(second["prompt"].split()) > words + 1
        for style in OVERFLOW_STYLES:
            # the first request fits with its max_tokens (vLLM checks both); the second does not
            server.overflow_style = style
            server.context_window = words + first["max_tokens"] if style.startswith("vllm") else words + 1
            seen = len(server.requests)
            proc = run_pipeline(*args, f"out_dir={tmp_path / style}")
            assert proc.returncode == 0, proc.stderr
            [record] = read_records(tmp_path / style / "react.jsonl")
            assert record["end_reason"] == "context_exceeded", (style, record["end_reason"])
            assert record["n_steps"] == 1 and record["steps"][0]["action"] == fine["steps"][0]["action"]
            assert not record["finished"] and record["prediction"] is None
            sent = [r for r in server.requests[seen:] if r.path == "/v1/completions"]
            assert len(sent) == 2, style  # step 1, then step 2 once: a 400 is not retried
            assert sent[1].body["prompt"] == second["prompt"]  # the same step-2 prompt, refused
