"""`plot` on summaries of two model sizes: the figure with sizes on its x axis, the table beside it
(sizes.md) and the check across sizes (is the smaller model fine-tuned above the larger one
prompted, with Newcombe's interval of the gap); one size writes none of them.

    .venv/bin/python -m pytest tests/test_plot_sizes.py -n 0 -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.report.intervals import difference_interval

REPO = Path(__file__).resolve().parents[1]
SMALL, LARGE = ("smollm2-135m", "135m", 0.135), ("gemma3-270m", "270m", 0.268)
N = 500


def row(model: tuple, mode: str, method: str, correct: int, **extra) -> dict:
    name, size_class, params_b = model
    label = name if mode == "prompt" else f"{name} (fine-tuned)"
    return {"model": label, "size_class": size_class, "params_b": params_b, "mode": mode, "method": method,
            "question_set": "offline-eval", "n": N, "em": correct / N, "f1": correct / N, "finish_rate": 0.9,
            "mean_steps": 3.0, "seconds": 1.0, "source": "ours", **extra}


# EM counts out of 500: the smaller model fine-tuned against the larger one prompted
GRID = [row(SMALL, "prompt", "standard", 31), row(SMALL, "prompt", "react", 8),
        row(SMALL, "finetune", "standard", 37), row(SMALL, "finetune", "react", 20),
        row(LARGE, "prompt", "standard", 40), row(LARGE, "prompt", "react", 5),
        row(LARGE, "finetune", "standard", 60), row(LARGE, "finetune", "react", 45)]
GRPO = row(("smollm2-135m-grpo", "135m", 0.135), "finetune", "react", 23, training="grpo")
ROUNDS = [dict(row(SMALL, "finetune", "react", 28), model="smollm2-135m round 2 (fine-tuned)"),
          dict(row(SMALL, "finetune", "react", 49), model="smollm2-135m round 3 (fine-tuned)")]


def plot(tmp_path: Path, rows: list[dict], *args: str, rounds: list[dict] | None = None) -> Path:
    """A real `python -m pipeline plot` process on these rows; returns its out_dir."""
    (tmp_path / "summary.json").write_text(json.dumps(rows))
    argv = [f"summaries=[{tmp_path / 'summary.json'}]", f"out_dir={tmp_path / 'plot'}", *args]
    if rounds:
        (tmp_path / "rounds.json").write_text(json.dumps(rounds))
        argv.append(f"rounds=[{tmp_path / 'rounds.json'}]")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "plot", *argv], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "plot"


def newcombe(a: int, b: int) -> list[float]:
    lo, hi = difference_interval(a, N, b, N)
    return [round(100 * lo, 2), round(100 * hi, 2)]


def test_two_sizes_draw_the_sizes_figure_its_table_and_the_check_across_sizes(tmp_path):
    out = plot(tmp_path, [*GRID, GRPO], rounds=ROUNDS)
    for name in ("figure3.png", "figure3-sizes.png", "figure3-sizes.svg", "sizes.md", "across_sizes.json"):
        assert (out / name).is_file(), name
    assert (out / "figure3-sizes.png").read_bytes().startswith(b"\x89PNG")

    gaps = json.loads((out / "across_sizes.json").read_text())
    found = [(g["method"], g["finetuned_smaller"]["size_class"], g["prompted_larger"]["size_class"],
              g["prompted_larger"]["method"], g["gap_pct"], g["interval_pct"], g["verdict"]) for g in gaps]
    assert found == [
        ("standard", "135m", "270m", "standard", -0.6, newcombe(37, 40), "fails, within noise"),
        ("react", "135m", "270m", "react", 3.0, newcombe(20, 5), "holds, beyond noise"),
        ("best", "135m", "270m", "standard", -4.0, newcombe(20, 40), "fails, beyond noise"),  # vs the best prompted
    ]
    assert newcombe(20, 5)[0] > 0 and newcombe(20, 40)[1] < 0 and newcombe(37, 40)[0] < 0 < newcombe(37, 40)[1]
    orderings = (out / "orderings.md").read_text()
    assert "## Across sizes" in orderings and "-> **holds, beyond noise**" in orderings
    assert "round 2" not in orderings and "grpo" not in orderings  # points beside the lines, not judged
    assert json.loads((out / "manifest.json").read_text())["outputs"]["sizes_md"] == str(out / "sizes.md")

    table = (out / "sizes.md").read_text()
    assert "| method | 135m prompted | 135m fine-tuned | 135m gain | 270m prompted | 270m fine-tuned | 270m gain |" in table
    lo, hi = difference_interval(45, N, 5, N)
    assert "| ReAct | 1.6 [0.8, 3.1] (500) | 4.0 [2.6, 6.1] (500) | +2.4 [" in table
    assert f"| 9.0 [6.8, 11.8] (500) | +8.0 [{100 * lo:+.1f}, {100 * hi:+.1f}] |" in table
    assert "| smollm2-135m round 3 (fine-tuned) | 135m | ReAct | 9.8 [7.5, 12.7] (500) |" in table
    assert "135m = smollm2-135m, smollm2-135m (fine-tuned)" in table  # each size names its models


def test_the_sizes_figure_draws_dashed_prompted_and_solid_fine_tuned_lines_with_intervals():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from pipeline.report.figure import (
        GRPO_MARKER,
        GRPO_STEP,
        ROUND_MARKER,
        draw_sizes_figure,
        size_step,
    )
    from pipeline.report.references import reference_rows
    from pipeline.report.summaries import validate_row

    rows = [validate_row(r, "r") for r in GRID]
    extra = [validate_row(r, "r") for r in [GRPO, *ROUNDS]]
    for r in extra[1:]:
        r["training"] = "self-training"
    fig = draw_sizes_figure(rows, extra, reference_rows(), "t")
    step = size_step([0.135, 0.268])  # 1/30 of the log distance between the sizes
    assert step ** 30 == pytest.approx(0.268 / 0.135)
    ours, published = fig.axes
    react = [line for line in ours.get_lines() if to_hex(line.get_color()) == "#d62728" and line.get_marker() == "o"]
    by_style = {line.get_linestyle(): line for line in react}
    assert set(by_style) == {"--", "-"}
    assert list(by_style["--"].get_ydata()) == pytest.approx([1.6, 1.0])  # prompted, 135M then 270M
    assert list(by_style["-"].get_ydata()) == pytest.approx([4.0, 9.0])  # fine-tuned
    assert by_style["--"].get_xdata()[0] < 0.135 < by_style["-"].get_xdata()[0] < 0.135 * step ** 5
    assert by_style["-"].get_xdata()[1] == pytest.approx(0.268 * step ** 2)  # ReAct's offset, right of the size
    # every point carries its 95% Wilson interval as an error bar (here: fine-tuned ReAct 45/500 at 270M)
    bars = [seg for c in ours.collections for seg in c.get_segments()
            if abs(seg[0][0] - 0.268 * step ** 2) < 1e-9 and seg[0][0] == seg[1][0]]
    assert [(round(s[0][1], 1), round(s[1][1], 1)) for s in bars] == [(6.8, 11.8)]
    triangles = [line for line in ours.get_lines() if line.get_marker() == GRPO_MARKER]
    squares = [line for line in ours.get_lines() if line.get_marker() == ROUND_MARKER]
    assert [list(t.get_xdata()) for t in triangles] == [pytest.approx([0.135 * step ** GRPO_STEP])]
    assert [(s.get_xdata()[0] / 0.135, s.get_ydata()[0]) for s in squares] == \
        [pytest.approx((step ** (GRPO_STEP + 2), 5.6)), pytest.approx((step ** (GRPO_STEP + 3), 9.8))]
    # every point of a size stays in the third of the distance nearest to it
    assert all(x < 0.135 * step ** 10 for line in ours.get_lines() for x in line.get_xdata() if x < 0.2)
    assert [t.get_text() for t in ours.texts] == ["round 2", "round 3"]
    assert ours.get_xscale() == "log" and [t.get_text() for t in ours.get_xticklabels()] == \
        ["135M\nsmollm2-135m", "268M\ngemma3-270m"]
    # the published points (PaLM-540B, FireAct's Llama-2) only in their own panel
    assert published.get_title().startswith("published") and not any(x > 1 for line in ours.get_lines()
                                                                      for x in line.get_xdata())
    assert {round(o.get_offsets()[0][0]) for o in published.collections} == {7, 13, 540}
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"prompted", "fine-tuned", "self-training round (its own trajectories)",
            "fine-tuned, then GRPO in the environment", "ReAct paper, published"} <= set(legend)
    plt.close(fig)


def test_one_size_writes_no_sizes_outputs_and_removes_stale_ones(tmp_path):
    out = plot(tmp_path, [*GRID, GRPO], "reference_points=false")
    assert (out / "sizes.md").is_file()
    small_only = [r for r in GRID if r["params_b"] == 0.135]
    out = plot(tmp_path, small_only, "reference_points=false")
    assert sorted(p.name for p in out.iterdir()) == ["figure3.png", "figure3.svg", "manifest.json", "orderings.json",
                                                     "orderings.md", "results.csv", "results.md"]
    assert "Across sizes" not in (out / "orderings.md").read_text()
