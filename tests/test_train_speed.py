"""The GPU speed choices as pure decisions (pipeline/train/speed.py), the FLOP arithmetic behind
MFU (pipeline/train/flops.py) and packing that keeps the batch (pipeline/train/batching.py). Fast, CPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.train.flops import (
    ThroughputMeter,
    attention_length,
    flops_per_token,
    matmul_params,
    peak_tflops,
)
from pipeline.train.speed import (
    Kernels,
    choose_attention,
    choose_loss,
    fsdp_plan,
    hub_flash_error,
    kernels_on,
    micro_batch_cap,
)

REPO_CONFIGS = Path(__file__).resolve().parents[1] / "accelerate_configs"


@pytest.mark.parametrize("kernels, half, expected, says", [
    (Kernels(cuda=False), False, "sdpa", "CPU"),
    (Kernels(cuda=False, flash_attn_2=True), True, "sdpa", "CPU"),
    (Kernels(cuda=True, flash_attn_2=True), False, "sdpa", "fp32"),
    (Kernels(cuda=True, hopper=True, flash_attn_2=True, flash_attn_3=True), True, "flash_attention_3", "Hopper"),
    (Kernels(cuda=True, hopper=False, flash_attn_2=True, flash_attn_3=True), True, "flash_attention_2", "flash_attn package"),
    (Kernels(cuda=True, kernels_hub=True), True, "flash_attention_2", "kernels-community/flash-attn2"),
    (Kernels(cuda=True), True, "sdpa", "pip install flash-attn"),
    (Kernels(cuda=True, kernels_hub_error="OSError: offline"), True, "sdpa", "cannot be loaded here: OSError: offline"),
])
def test_auto_attention_takes_the_varlen_flash_path_where_it_can(kernels, half, expected, says):
    for requested in ("auto", None):
        chosen, why = choose_attention(requested, kernels, half)
        assert chosen == expected and says in why and why.startswith(f"attention: {expected}")


def test_a_hub_kernel_that_cannot_be_loaded_means_sdpa(monkeypatch, tmp_path):
    """`kernels` found beside no flash package: the hub kernel is loaded through transformers'
    own loader before it is chosen. On this machine that load fails for real (no `kernels`
    package that this transformers accepts, no hub, an empty cache), so `auto` takes SDPA and
    its line says why, where before it chose flash_attention_2 and the model load raised."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    hub_flash_error.cache_clear()
    found = {"kernels"}.__contains__  # `kernels` installed, flash_attn not
    kernels = kernels_on(cuda=True, major=8, found=found)
    assert not kernels.kernels_hub and kernels.kernels_hub_error == hub_flash_error()
    assert kernels.kernels_hub_error.split(":")[0] in ("ImportError", "OSError", "ValueError", "LocalEntryNotFoundError")
    chosen, why = choose_attention("auto", kernels, True)
    assert chosen == "sdpa" and kernels.kernels_hub_error in why
    # a flash package present: the hub is never tried; no `kernels`: nothing to say about it
    assert kernels_on(cuda=True, major=8, found={"kernels", "flash_attn"}.__contains__).kernels_hub_error is None
    assert kernels_on(cuda=True, major=8, found=set().__contains__) == Kernels(cuda=True)
    assert kernels_on(cuda=False, major=0, found=found) == Kernels(cuda=False)


def test_a_flash_attn_that_does_not_import_means_sdpa_with_the_reason(monkeypatch, tmp_path):
    """A stand-in `flash_attn` package on sys.path that raises at import, as a flash-attn wheel
    built for another torch does ("undefined symbol"): find_spec finds it, which was all the plan
    asked, so `auto` chose flash_attention_2 and every rank crashed at model load. Now its import
    is probed: SDPA, with the reason, and the micro-batch cap that SDPA brings."""
    fake = tmp_path / "flash_attn"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    found = lambda name: importlib.util.find_spec(name) is not None  # noqa: E731 (the real lookup)
    assert found("flash_attn")
    kernels = kernels_on(cuda=True, major=9, found=found)
    assert not kernels.flash_attn_2 and not kernels.kernels_hub
    assert "flash_attn is installed but does not import (ImportError: flash_attn_2_cuda.so: undefined symbol" \
        in kernels.flash_attn_error
    chosen, why = choose_attention("auto", kernels, True)
    assert chosen == "sdpa" and kernels.flash_attn_error in why and "reinstall flash-attn" in why
    assert micro_batch_cap("padding_free", chosen, 8)[0] == 1


def test_configured_attention_is_taken_as_given():
    assert choose_attention("eager", Kernels(cuda=False), False)[0] == "eager"
    assert choose_attention("sdpa", Kernels(cuda=True, flash_attn_2=True), True)[0] == "sdpa"
    with pytest.raises(PipelineError, match="flash_attention_2 needs a CUDA GPU"):
        choose_attention("flash_attention_2", Kernels(cuda=False), True)


def test_loss_switch():
    assert choose_loss("auto", cuda=True)[0] == "chunked" and choose_loss("auto", cuda=False)[0] == "model"
    assert choose_loss("chunked", cuda=False)[0] == "chunked" and choose_loss("model", cuda=True)[0] == "model"
    with pytest.raises(PipelineError, match="not one of auto, model, chunked"):
        choose_loss("liger", cuda=True)


def launch_env(config: str) -> dict:
    """The variables `accelerate launch` gives the processes for one of our accelerate configs."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env
    args = launch_command_parser().parse_args(["--config_file", str(REPO_CONFIGS / f"{config}.yaml"),
                                               "--num_processes", "2", "x.py"])
    args, *_ = _validate_launch_command(args)
    return prepare_multi_gpu_env(args)


def test_fsdp_config_uses_fsdp_checkpointing_and_sharded_checkpoints():
    env = launch_env("fsdp")
    plan = fsdp_plan(True, env)
    assert env["FSDP_ACTIVATION_CHECKPOINTING"] == "true" and env["FSDP_VERSION"] == "2"
    assert plan.transformers_checkpointing is False and plan.checkpointing is True
    assert plan.state_dict_type == "SHARDED_STATE_DICT" and plan.final_gather
    with pytest.raises(PipelineError, match="fsdp_activation_checkpointing: true"):
        fsdp_plan(True, {**env, "FSDP_ACTIVATION_CHECKPOINTING": "false"})
    plain = fsdp_plan(True, launch_env("multi_gpu"))  # not FSDP: transformers' checkpointing
    assert plain.transformers_checkpointing and plain.state_dict_type is None and not plain.final_gather


class Llama8B:  # meta-llama/Llama-3.1-8B config.json
    hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads = 4096, 32, 32, 8
    intermediate_size, vocab_size, head_dim = 14336, 128256, 128


def test_matmul_params_of_llama_3_1_8b():
    # 8,030,261,248 parameters, less the input embedding (128256 x 4096: a lookup) and the norms
    assert matmul_params(Llama8B) == 8_030_261_248 - 128256 * 4096 - (2 * 32 + 1) * 4096


def test_matmul_params_count_a_real_model_linear_layers():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=96, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert matmul_params(config) == linear


def test_training_flops_per_token():
    n = matmul_params(Llama8B)
    attn = 4 * 32 * 4096 * 600  # forward attention of a token in a 600-token example
    full = flops_per_token(Llama8B, full_finetuning=True, checkpointing=False, attention_length=600)
    assert full.model == full.hardware == 6 * n + 3 * attn
    ckpt = flops_per_token(Llama8B, full_finetuning=True, checkpointing=True, attention_length=600)
    assert ckpt.model == 6 * n + 3 * attn and ckpt.hardware == 8 * n + 4 * attn
    lora = flops_per_token(Llama8B, full_finetuning=False, checkpointing=True, attention_length=600)
    assert lora.model == 4 * n + 3 * attn and lora.hardware == 6 * n + 4 * attn
    assert 6 * n + 3 * attn == pytest.approx(4.60e10, rel=0.005)  # 6 x 7.50e9 = 4.50e10, + 2 % attention at 600 tokens
    assert attention_length([100, 300]) == (100 * 100 + 300 * 300) / 400


def test_mfu_arithmetic():
    per_token = flops_per_token(Llama8B, full_finetuning=True, checkpointing=True, attention_length=600)
    meter = ThroughputMeter(per_token, processes=8, peak=989.0)
    meter._tokens_at_last_log, meter._seconds = 1000, 2.0  # 10 s between logs, 2 of them training
    out = meter.metrics(1000 + 8 * 4000)  # 8 GPUs x 4,000 tokens in 2 s: 2,000 tokens/s per GPU
    assert out["tokens_per_s_per_device"] == 2000
    assert out["tflops_per_device"] == pytest.approx(2000 * per_token.model / 1e12, abs=1e-3)
    assert out["mfu"] == pytest.approx(2000 * per_token.model / 989e12, abs=1e-4)
    assert out["hfu"] == pytest.approx(2000 * per_token.hardware / 989e12, abs=1e-4)
    assert meter.metrics(1000 + 8 * 4000) == {}  # nothing trained since: nothing to say
    no_peak = ThroughputMeter(per_token, processes=1, peak=None)
    no_peak._tokens_at_last_log, no_peak._seconds = 0, 1.0
    assert set(no_peak.metrics(100)) == {"tokens_per_s_per_device", "tflops_per_device"}


def test_a_launchs_first_step_is_left_out_of_the_throughput():
    """The first step of each launch (a resume too) carries the warm-up: no figures at the first
    logged step, and the next log counts only the steps after it, tokens and time alike."""
    import time
    from types import SimpleNamespace

    per_token = flops_per_token(Llama8B, full_finetuning=True, checkpointing=False, attention_length=600)
    meter = ThroughputMeter(per_token, processes=1, peak=989.0)
    callback, state = meter.callback(), SimpleNamespace(num_input_tokens_seen=0)

    def step(tokens: int, seconds: float) -> None:
        callback.on_step_begin(None, state, None)
        time.sleep(seconds)
        state.num_input_tokens_seen += tokens
        callback.on_step_end(None, state, None)

    for launch in range(2):  # a launch, then its resume
        callback.on_train_begin(None, state, None)
        step(5000, 0.3)  # the slow first step
        assert meter.metrics(state.num_input_tokens_seen) == {}, launch
        step(1000, 0.05)
        step(1000, 0.05)
        figures = meter.metrics(state.num_input_tokens_seen)
        # the two later steps alone: 2,000 tokens in a little over 0.1 s
        assert 10_000 < figures["tokens_per_s_per_device"] <= 2000 / 0.1, figures


def test_peak_table():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and peak_tflops("NVIDIA L40S") == 362.0
    assert peak_tflops("NVIDIA L4") == 121.0 and peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("Some CPU") is None and peak_tflops(None) is None


def test_padding_free_without_a_varlen_kernel_takes_one_trajectory_per_micro_batch():
    from pipeline.train.speed import micro_batch_cap
    cap, why = micro_batch_cap("padding_free", "sdpa", 8)
    assert cap == 1 and "dense block-diagonal mask" in why
    assert micro_batch_cap("padding_free", "flash_attention_2", 8) == (8, None)
    assert micro_batch_cap("padded", "sdpa", 8) == (8, None)
    assert micro_batch_cap("packing", "sdpa", 8) == (8, None)


def test_batch_split_keeps_an_explicit_micro_batch(tmp_path):
    from pipeline.core.config import load_config
    from pipeline.train.config import FinetuneConfig, resolve
    from pipeline.train.launch import Launch
    from pipeline.train.plan import plan_training
    cfg = lambda *o: resolve(load_config(FinetuneConfig, None, ["global_batch_size=8", *o]))  # noqa: E731
    batch_split = lambda c, n: plan_training(c, Launch(world_size=n)).batch  # noqa: E731
    assert batch_split(cfg(), 2)[:2] == (1, 4)  # CPU: sdpa, padding-free
    assert batch_split(cfg("per_device_batch_size=4"), 2) == (4, 1, None)
    assert batch_split(cfg("batching=padded"), 1) == (8, 1, None)


RANK_PLAN_SCRIPT = """
import json, os, sys

from pipeline.core.config import load_config
from pipeline.train import plan, speed
from pipeline.train.config import FinetuneConfig, resolve
from pipeline.train.speed import Kernels

rank = int(os.environ["RANK"])
# STAND-IN for the hub fetch (no GPU here): rank 0 fetched kernels-community/flash-attn2, rank 1's fetch failed
fetched = (Kernels(cuda=True, kernels_hub=True) if rank == 0
           else Kernels(cuda=True, kernels_hub_error="OSError: the hub is unreachable"))
for module in (speed, plan):  # wherever plan_training reads the kernels from
    if hasattr(module, "installed_kernels"):
        module.installed_kernels = lambda: fetched
cfg = resolve(load_config(FinetuneConfig, None, ["global_batch_size=16", "precision=bf16", "batching=padding_free"]))
chosen = plan.plan_training(cfg, cuda=True)
with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as f:
    json.dump([chosen.attention, *chosen.batch[:2]], f)
"""


@pytest.mark.slow
def test_every_rank_takes_rank0s_attention_kernel_and_micro_batch(tmp_path):
    """A real 2-process launch (accelerate, DDP over gloo, as cpu_ddp) whose ranks see different
    kernels: rank 0's hub fetch succeeded, rank 1's failed (a labelled stand-in for the fetch).
    Every rank must plan rank 0's attention kernel and so the same micro-batch and accumulation;
    before, rank 1 planned sdpa with 1 x 8 against rank 0's flash_attention_2 with 8 x 1, and a
    real run would hang in its collectives."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "rank_plan.py"
    script.write_text(RANK_PLAN_SCRIPT, encoding="utf-8")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO_CONFIGS / "cpu_ddp.yaml"),
           "--num_processes", "2", str(script), str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO_CONFIGS.parent), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    plans = [json.loads((tmp_path / f"rank-{r}.json").read_text(encoding="utf-8")) for r in (0, 1)]
    assert plans[0] == ["flash_attention_2", 8, 1]  # rank 0's own choice: the hub kernel, 8 per device
    assert plans[1] == plans[0]
