"""The `run` orchestrator: the shipped grids plan cleanly, a bad section fails before any work,
and a tiny grid runs end to end, survives a kill, and finishes at once when run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.config import build, read_yaml
from pipeline.stages.run import RunConfig, Student, plan

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["demo.yaml", "paper.yaml"])
def test_shipped_experiment_configs_plan_every_unit(name):
    cfg = build(RunConfig, read_yaml(REPO / "configs" / name))
    students = [build(Student, s) for s in cfg.students]
    titles = [u.title for u in plan(cfg, students)]
    trained = sum(s.finetune for s in students)
    prompted = sum(bool(s.prompt_model) for s in students)
    assert titles[0].startswith("generate") and titles[1].startswith("filter") and titles[-1].startswith("plot")
    assert sum(t.startswith("train") for t in titles) == 4 * trained
    assert sum(t.startswith("eval") for t in titles) == 4 * trained + prompted


def run_pipeline(*args: str, cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True,
                          text=True, **kwargs)


def test_a_typo_in_a_later_section_fails_before_anything_runs(tmp_path):
    data = read_yaml(REPO / "configs" / "demo.yaml")
    data["out_dir"] = str(tmp_path / "run")
    data["eval"]["limt"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = run_pipeline("run", "--config", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "unknown key 'limt'; did you mean 'limit'" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def tiny_prompt_model(tmp_path_factory) -> Path:
    """A randomly initialised tiny Llama with the SmolLM2 tokenizer, as a 'base model' to prompt."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from pipeline.llm.smollm2 import local_smollm2_dir

    tokenizer = AutoTokenizer.from_pretrained(local_smollm2_dir())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, max_position_embeddings=8192,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    out = tmp_path_factory.mktemp("tiny-base")
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_grid(tmp_path: Path, shared_data: Path, base: Path) -> Path:
    config = {
        "experiment": "e2e",
        "out_dir": str(tmp_path / "run"),
        "methods": ["standard", "react"],
        "wiki": {"index": str(tmp_path / "wiki.sqlite"), "corpus": [str(shared_data / "wiki" / "corpus.jsonl")]},
        "generate": {"teacher": {"backend": "oracle"}, "questions": "offline-bootstrap", "limit": 12},
        "filter": {"tokenizer": "smollm2"},
        "train": {"output_root": str(tmp_path / "ckpt"), "max_steps": 2, "global_batch_size": 4,
                  "accelerate_config": "cpu", "save_steps": 1},
        "eval": {"questions": "offline-eval", "limit": 3, "max_in_flight": 3,
                 "prompting": {"max_new_tokens": 8, "max_steps": 2}},
        "plot": {"reference_points": False},
        "students": [{"name": "tiny", "config": str(REPO / "configs" / "students" / "tiny.yaml"),
                      "size_class": "tiny", "params_b": 0.0032,
                      "prompt_model": {"backend": "transformers", "model": str(base), "name": "tiny-base"}}],
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def outputs(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*.jsonl"))}


@pytest.mark.slow
def test_a_tiny_grid_runs_end_to_end_survives_a_kill_and_then_skips_everything(
        tmp_path, shared_data, tiny_prompt_model):
    grid = tiny_grid(tmp_path, shared_data, tiny_prompt_model)
    run_dir = tmp_path / "run"

    # 1. kill the whole process tree once training has started
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--config", str(grid)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "train: tiny on standard" in line:
            time.sleep(3)
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (run_dir / "generate" / "react.jsonl").exists() and not (run_dir / "plot").exists()

    # 2. re-run: completes, figure and table written
    done = run_pipeline("run", "--config", str(grid), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("figure3.png", "figure3.svg", "results.csv", "results.md", "orderings.md"):
        assert (run_dir / "plot" / name).stat().st_size > 0
    assert (tmp_path / "ckpt" / "e2e" / "tiny" / "react" / "final" / "manifest.json").exists()
    summaries = sorted(p.parent.name for p in (run_dir / "eval").glob("*/summary.json"))
    assert summaries == ["tiny-ft-react", "tiny-ft-standard", "tiny-prompt"]
    before = outputs(run_dir)

    # 3. run again: every unit is skipped, no record changes
    again = run_pipeline("run", "--config", str(grid), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("[run] skip:") == 6  # generate, 1 prompted eval, 2 trainings, 2 evals
    assert outputs(run_dir) == before
