"""What the real-vLLM tests share: the project's vLLM environment (.venv-vllm, made by
scripts/setup_vllm.sh; without it the tests skip with one line saying so), a rank-64 LoRA
adapter of the embedded SmolLM2 built here with PEFT, the settings that keep a CPU start-up
short, and a way to find every process a server started (an environment tag they all inherit).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path

import psutil
import pytest

from pipeline.llm.leftovers import live
from pipeline.llm.serving import VLLM_VENV

VLLM_PYTHON = VLLM_VENV / "bin" / "python"
INSTALL_LINE = ("vLLM is not installed for this checkout (.venv-vllm); bash scripts/setup_vllm.sh "
                "installs it (about 3 min; .ci/run does)")
TAG_VAR = "REACT_PIPELINE_TEST_SERVER"  # set in a test server's environment; its processes inherit it
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Served on 2 CPU cores: eager mode skips torch.compile's warm-up; 1 GiB of KV cache is
# 23k fp32 tokens of SmolLM2-135M, room for 8 ReAct episodes at once.
MODEL_SETTINGS = {"dtype": "float32", "max_context": 4096, "extra": {"enforce_eager": True}}
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def require_vllm() -> None:
    if not VLLM_PYTHON.is_file():
        pytest.skip(INSTALL_LINE)


def new_tag() -> str:
    return uuid.uuid4().hex[:12]


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Every live (not zombie) process of a test server: those whose environment carries `tag`,
    and every descendant of those (vLLM renames its engine core and worker processes, and the
    rename overwrites what /proc shows of their environment), wherever they were re-parented."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter():
        try:
            if process.environ().get(TAG_VAR) == tag:
                for p in [process, *process.children(recursive=True)]:
                    found[p.pid] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return [p for p in found.values() if live(p)]


def wait_until_gone(tag: str, timeout_s: float, seen: list[psutil.Process] = ()) -> list[str]:
    """Wait until no process of the tagged server is left, nor any of `seen` (a snapshot taken
    while it ran: a process that lost its tagged parent is found this way); return what is still
    there after `timeout_s` (pid and name), having killed it so no test leaves a server behind."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {p.pid: p for p in [*tagged_processes(tag), *seen] if live(p)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    names = []
    for process in left.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            names.append(f"{process.pid} {process.name()}")
            process.kill()
    return names


def build_lora_adapter(smollm2_dir: Path, folder: Path, rank: int = 64) -> Path:
    """A PEFT LoRA adapter of SmolLM2-135M, r=64 on q/k/v/o/gate/up/down (the 70B student's
    settings), with non-zero weights (PEFT starts B at zero: an adapter that changes nothing would
    prove nothing), in a `final` folder with the manifest pipeline/finetune.py writes, so that
    `eval finetuned=` takes it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from pipeline.core.storage import write_manifest

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=LORA_TARGETS, init_lora_weights=False,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # small enough to keep the model fluent, large enough to change its answers
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.15)
    folder.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(folder)
    adapter_config = folder / "adapter_config.json"
    config_json = json.loads(adapter_config.read_text())
    config_json["base_model_name_or_path"] = str(smollm2_dir)
    adapter_config.write_text(json.dumps(config_json, indent=2))
    write_manifest(folder / "manifest.json", stage="train", config={}, complete=True, student="smollm2-lora",
                   base_model=str(smollm2_dir), adapter=True, finetuning="lora", format="react",
                   size_class="135m", params_b=0.135, steps=1, max_steps=1)
    return folder


def grid_config(tmp_path: Path, index: Path, questions: Path, model: dict, serve: dict,
                max_in_flight: int = 2) -> Path:
    """A tiny `run` grid whose eval phase has three units needing one base model served: SmolLM2
    prompted (Act, ReAct) and two LoRA students of it (Act, ReAct): one server can serve them all."""
    import yaml

    student = tmp_path / "student.yaml"
    student.write_text(yaml.safe_dump({"student": "smollm2", "size_class": "135m", "finetuning": "lora",
                                       "lora": {"r": 64, "alpha": 64}, "output_root": str(tmp_path / "ckpt")}))
    config = {"experiment": "shared", "out_dir": str(tmp_path / "run"), "formats": ["act", "react"],
              "wiki": {"index": str(index)},
              "generate": {"oracle": "exact", "questions": "offline-bootstrap", "limit": 4},
              "filter": {"tokenizer": "smollm2"},
              "eval": {"questions": str(questions), "max_in_flight": max_in_flight, "model": model, "serve": serve,
                       "prompting": {"max_new_tokens": 24, "max_steps": 2}},
              "plot": {"reference_points": False},
              "students": [{"name": "tiny", "config": str(student), "size_class": "135m", "params_b": 0.135,
                            "prompt_model": {**model, "model": "smollm2", "name": "SmolLM2"}}]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def mark_trained(config_path: Path, adapter: Path | None = None, phases: tuple[str, ...] = ("train",)) -> list[Path]:
    """Each LoRA student of the grid (its training units in `phases`: "rounds" for self-training
    rounds' students too) as its training would leave it (complete, with this config), so that
    `run` skips training and evaluates: the adapter's files copied from `adapter` (or only an
    adapter_config.json of rank 64, for a stand-in server that loads no weights)."""
    import shutil

    from pipeline.core.config import build, load_config, to_dict
    from pipeline.core.storage import write_manifest
    from pipeline.hub.models import resolve_model_path
    from pipeline.stages.grid.plan import plan
    from pipeline.stages.grid.precision import training_precision
    from pipeline.stages.grid.spec import RunConfig, Student

    cfg = load_config(RunConfig, config_path, [])
    finals = []
    for unit in plan(cfg, [build(Student, s) for s in cfg.students]):
        if unit.phase not in phases or not unit.title.startswith("train"):
            continue
        ft = unit.config
        final = Path(ft.output_dir) / "final"
        if adapter is not None:
            shutil.copytree(adapter, final, dirs_exist_ok=True)
        else:
            final.mkdir(parents=True, exist_ok=True)
            (final / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 64}))
        write_manifest(final / "manifest.json", stage="train", config=to_dict(ft), complete=True,
                       student=ft.student_name, base_model=resolve_model_path(ft.student), adapter=True,
                       finetuning="lora", format=ft.format, size_class=ft.size_class, params_b=0.135,
                       steps=1, max_steps=1, precision=training_precision(ft))
        finals.append(final)
    return finals
