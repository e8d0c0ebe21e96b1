"""Plot stage: figure/table files, the orderings check's verdicts, and bad-input errors.

    .venv/bin/python -m pytest tests/test_plot.py -q
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.report.orderings import check_orderings
from pipeline.report.references import TABLE1_HOTPOTQA_EM, reference_rows
from pipeline.report.summaries import load_summaries, validate_row
from pipeline.stages.plot import PlotConfig, run_plot

REPO = Path(__file__).resolve().parents[1]
FIREACT_TRAJS = REPO.parent / "shared" / "data" / "fireact" / "trajs"


def row(model: str, size_class: str, params_b: float | None, mode: str, method: str, em: float,
        question_set: str = "offline-eval", n: int = 1000) -> dict:
    return {"model": model, "size_class": size_class, "params_b": params_b, "mode": mode, "method": method,
            "question_set": question_set, "n": n, "em": em, "f1": min(1.0, em + 0.1), "finish_rate": 0.9,
            "mean_steps": 3.0, "prompt_tokens": 100, "completion_tokens": 50, "seconds": 1.0, "source": "ours"}


def grid(prompt8: dict, prompt62: dict, tuned8: dict, tuned62: dict) -> list[dict]:
    rows = []
    for (model, size, params), mode, ems in (
        (("M-8B", "8b", 8.0), "prompt", prompt8), (("M-70B", "62b", 70.0), "prompt", prompt62),
        (("M-8B", "8b", 8.0), "finetune", tuned8), (("M-70B", "62b", 70.0), "finetune", tuned62),
    ):
        rows += [row(model, size, params, mode, method, em) for method, em in ems.items()]
    return rows


# The paper's shape: every ordering holds.
PAPER_LIKE = grid(
    prompt8={"standard": 0.20, "cot": 0.22, "act": 0.18, "react": 0.12},
    prompt62={"standard": 0.26, "cot": 0.28, "act": 0.24, "react": 0.20},
    tuned8={"standard": 0.21, "cot": 0.22, "act": 0.27, "react": 0.31},
    tuned62={"standard": 0.27, "cot": 0.26, "act": 0.34, "react": 0.38},
)
# The opposite: every ordering fails.
INVERTED = grid(
    prompt8={"standard": 0.10, "cot": 0.12, "act": 0.14, "react": 0.20},
    prompt62={"standard": 0.30, "cot": 0.31, "act": 0.32, "react": 0.40},
    tuned8={"standard": 0.30, "cot": 0.32, "act": 0.25, "react": 0.20},
    tuned62={"standard": 0.50, "cot": 0.52, "act": 0.30, "react": 0.28},
)


def verdicts(rows, references=None, margin=0.0):
    return [r.verdict for r in check_orderings([validate_row(r, f"row {i}") for i, r in enumerate(rows)],
                                               references, margin)]


def test_orderings_all_hold_on_the_papers_shape():
    assert verdicts(PAPER_LIKE) == ["holds", "holds", "holds", "cannot check", "holds"]
    # ordering 4 needs 540B prompting: from the data, or else from the paper's Table 1
    assert verdicts(PAPER_LIKE, reference_rows())[3] == "holds"  # 38.0 > Table 1's best four-method 29.4
    with_540 = PAPER_LIKE + [row("P-540B", "540b", 540.0, "prompt", m, 0.39) for m in ("standard", "cot", "act", "react")]
    assert verdicts(with_540, reference_rows())[3] == "fails"  # the data's own 540B rows win over the reference
    # ordering 1 is stated at 8B and 62B: a 540B group where ReAct is not the worst is shown, not counted
    result = check_orderings([validate_row(r, "r") for r in with_540])[0]
    assert result.verdict == "holds" and any("P-540B (540b): fails" in d and "not counted" in d for d in result.details)


def test_orderings_all_fail_on_the_inverted_shape():
    assert verdicts(INVERTED, reference_rows()) == ["fails", "fails", "fails", "fails", "fails"]


def test_orderings_partly_and_margin():
    mixed = [dict(r) for r in PAPER_LIKE]
    for r in mixed:  # at 62B prompting, make ReAct beat Act
        if (r["mode"], r["size_class"], r["method"]) == ("prompt", "62b", "react"):
            r["em"] = 0.25
    assert verdicts(mixed)[0] == "partly holds"
    # ordering 5 with a "clearly" margin: at 8B the gap is 5 points, at 62B 7 points
    assert verdicts(PAPER_LIKE, margin=6.0)[4] == "partly holds"
    assert verdicts(PAPER_LIKE, margin=8.0)[4] == "fails"


def test_orderings_say_what_cannot_be_checked():
    tiny = [row("Smol-135M", "135m", 0.135, "prompt", m, e) for m, e in
            (("standard", 0.05), ("cot", 0.04), ("act", 0.03), ("react", 0.02))]
    tiny += [row("Smol-135M", "135m", 0.135, "finetune", m, 0.1) for m in ("react", "act")]
    results = check_orderings([validate_row(r, "r") for r in tiny])
    assert [r.verdict for r in results] == ["holds", "cannot check", "cannot check", "cannot check", "cannot check"]
    assert any("checked here only at 135m" in d for d in results[0].details)
        # 2% vs 3% over 1000 questions each: the 1-point gap's 95% interval (Newcombe) spans 0
    assert results[0].caveats == ["only at 135m, not the paper's 8B/62B",
                                  "every deciding gap is within noise (its 95% interval contains 0)"]
    assert any("missing Standard, CoT" in d for d in results[1].details)
    assert results[2].details == ["no fine-tuned ReAct row at size class 8b", "no prompting rows at size class 62b"]


def test_noise_is_flagged_when_counts_are_small():
    small = [dict(r, n=20) for r in PAPER_LIKE]
    results = check_orderings([validate_row(r, "r") for r in small])
    assert all("within noise" in d for d in results[1].details)
    assert results[1].caveats == ["every deciding gap is within noise (its 95% interval contains 0)"]
    assert check_orderings([validate_row(r, "r") for r in PAPER_LIKE], reference_rows())[3].caveats == \
        ["against published numbers, not a run of ours"]


def write_summary(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps(rows))
    return path


def test_run_plot_writes_valid_files(tmp_path, capsys):
    summary = write_summary(tmp_path / "summary.json",
                            PAPER_LIKE + [row("M-70B", "62b", 70.0, "prompt", "cot_sc", 0.30)])
    out = tmp_path / "plot"
    paths = run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(out)))
    png = paths["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image

    height, width = matplotlib.image.imread(paths["png"]).shape[:2]
    assert width > height > 300
    svg = ET.parse(paths["svg"]).getroot()
    assert svg.tag.endswith("svg")
    svg_text = paths["svg"].read_text()
    for text in ("Prompting", "Fine-tuning", "ReAct", "CoT-SC", "PaLM-540B", "Llama-2-7B"):
        assert text in svg_text
    table = list(csv.DictReader(paths["csv"].open()))
    references = reference_rows()
    assert len(table) == len(PAPER_LIKE) + 1 + len(references)
    ours = [t for t in table if t["source"] == "ours"]
    assert {(t["mode"], t["size_class"], t["method"], t["em_pct"]) for t in ours} >= {("finetune", "62b", "react", "38.0")}
    assert {t["em_pct"] for t in table if t["source"] == "paper"} == {str(v) for v in TABLE1_HOTPOTQA_EM.values()}
    md = paths["md"].read_text()
    # each cell carries its 95% Wilson interval: 120/1000 -> [10.1, 14.2]
    assert "| ReAct | 12.0 [10.1, 14.2] (n=1000) | 20.0 [17.6, 22.6] (n=1000) |" in md
    assert "| CoT-SC | – | 30.0 [27.2, 32.9] (n=1000) |" in md
    react_8b = next(t for t in ours if (t["mode"], t["size_class"], t["method"]) == ("prompt", "8b", "react"))
    assert (react_8b["em_lo_pct"], react_8b["em_hi_pct"]) == ("10.13", "14.16")
    orderings = json.loads(paths["orderings_json"].read_text())
    assert [o["verdict"] for o in orderings] == ["holds", "holds", "holds", "holds", "holds"]
    printed = capsys.readouterr().out
    assert "-> **holds**" in printed and str(paths["png"]) in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["orderings"] == {str(i): "holds" for i in range(1, 6)}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    # same data, same bytes (no timestamps in the files)
    before = paths["svg"].read_bytes()
    run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(out)))
    assert paths["svg"].read_bytes() == before


def drawn_colors(ax) -> set[str]:
    """Every colour an axes draws in: its lines (error-bar lines too) and its point collections."""
    from matplotlib.colors import to_hex

    colors = {to_hex(line.get_color()) for line in ax.get_lines()}
    for collection in ax.collections:
        colors |= {to_hex(c) for c in [*collection.get_facecolors(), *collection.get_edgecolors()]}
    return colors


def test_every_registered_method_is_drawn_and_tabled(tmp_path):
    """No fixed list in the report: each registry row present in the summaries is drawn in both
    panels, named in the legend and given a table line; a name without a row is an error."""
    import matplotlib.pyplot as plt

    from pipeline.methods.registry import METHODS
    from pipeline.report.figure import draw_figure
    from pipeline.report.tables import results_markdown

    rows = load_summaries([write_summary(tmp_path / "s.json", [
        row("M-8B", "8b", 8.0, mode, spec.name, 0.1 + 0.05 * i)
        for mode in ("prompt", "finetune") for i, spec in enumerate(METHODS)])])
    fig = draw_figure(rows, [], "t")
    for ax in fig.axes:
        assert drawn_colors(ax) >= {spec.color for spec in METHODS}
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [s.label for s in METHODS if s.line] + [s.label for s in METHODS if not s.line]
    plt.close(fig)
    table = results_markdown(rows, [], ["offline-eval"])
    assert all(table.count(f"\n| {spec.label} | ") == 2 for spec in METHODS)
    stray = [dict(rows[0], method="unregistered")]
    with pytest.raises(PipelineError, match="unknown method 'unregistered'"):
        draw_figure(stray, [], "t")
    with pytest.raises(PipelineError, match="unknown method 'unregistered'"):
        results_markdown(stray, [], ["offline-eval"])
    plt.close("all")


def test_a_new_method_is_one_registry_row_from_the_figure_and_refused_without_it(tmp_path, monkeypatch):
    from pipeline.methods import registry
    from pipeline.report.figure import draw_figure

    summary = write_summary(tmp_path / "summary.json", PAPER_LIKE + [row("M-8B", "8b", 8.0, "prompt", "react_x", 0.30)])
    with pytest.raises(PipelineError, match=r"row 16: unknown method 'react_x'; expected one of standard, .*registry"):
        run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "refused")))
    assert not (tmp_path / "refused").exists()
    new = registry.MethodSpec("react_x", ("react",), registry.Interactive, "ReAct-X", "#17becf", "^", line=False)
    monkeypatch.setattr(registry, "METHODS", (*registry.METHODS, new))
    paths = run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "plot")))
    assert "| ReAct-X | 30.0 [27.2, 32.9] (n=1000) | – |" in paths["md"].read_text()
    assert "ReAct-X" in paths["svg"].read_text()
    fig = draw_figure(load_summaries([summary]), [], "t")
    assert "#17becf" in drawn_colors(fig.axes[0]) and "#17becf" not in drawn_colors(fig.axes[1])
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_reference_points_off(tmp_path):
    summary = write_summary(tmp_path / "summary.json", PAPER_LIKE)
    paths = run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "plot"), reference_points=False))
    assert {r["source"] for r in csv.DictReader(paths["csv"].open())} == {"ours"}
    assert "PaLM-540B" not in paths["svg"].read_text()
    assert json.loads(paths["orderings_json"].read_text())[3]["verdict"] == "cannot check"


def test_a_grpo_student_is_a_triangle_beside_the_fine_tuned_points_and_a_column_of_its_own(tmp_path):
    """A row with `training: grpo` (eval of a `grpo` final/) is drawn apart from the ReAct line, as
    a triangle with its Wilson interval right of the fine-tuned 8B point; the table gives it a
    column, the CSV a `training` column; the paper's orderings do not judge it."""
    import matplotlib.pyplot as plt

    from pipeline.report.figure import GRPO_DODGE, GRPO_MARKER, draw_figure

    grpo = dict(row("M-8B-grpo (GRPO)", "8b", 8.0, "finetune", "react", 0.45, n=100), training="grpo")
    summary = write_summary(tmp_path / "summary.json", PAPER_LIKE + [grpo])
    paths = run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "plot"), reference_points=False))
    md = paths["md"].read_text()
    assert "| method | M-8B (8b) | M-8B-grpo (GRPO) (8b) | M-70B (62b) |" in md
    assert "| ReAct | 31.0 [28.2, 33.9] (n=1000) | 45.0 [35.6, 54.8] (n=100) | 38.0 [35.0, 41.0] (n=1000) |" in md
    table = list(csv.DictReader(paths["csv"].open()))
    assert [(t["model"], t["method"]) for t in table if t["training"] == "grpo"] == [("M-8B-grpo (GRPO)", "react")]
    assert json.loads(paths["orderings_json"].read_text())[1]["verdict"] == "holds"  # not "partly": not judged
    assert "M-8B-grpo" not in paths["orderings"].read_text()

    fig = draw_figure(load_summaries([summary]), [], "t")
    prompting, tuning = fig.axes
    triangles = [line for ax in fig.axes for line in ax.get_lines() if line.get_marker() == GRPO_MARKER]
    assert len(triangles) == 1 and triangles[0].axes is tuning
    assert list(triangles[0].get_xdata()) == [8.0 * GRPO_DODGE] and list(triangles[0].get_ydata()) == [45.0]
    bars = [c for c in tuning.collections if c.get_segments() and abs(c.get_segments()[0][0][0] - 8.0 * GRPO_DODGE) < 1e-9]
    (low, high), = [(seg[0][1], seg[1][1]) for seg in bars[0].get_segments()]
    assert (round(low, 1), round(high, 1)) == (35.6, 54.8)  # the Wilson interval of 45/100
    react = [line for line in tuning.get_lines() if line.get_marker() == "o" and line.get_color() == "#d62728"]
    assert [list(line.get_xdata()) for line in react] == [[8.0 * 1.07 ** 1.5, 70.0 * 1.07 ** 1.5]]  # its line: SFT only
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[-1] == "fine-tuned, then GRPO in the environment"
    plt.close(fig)


def test_another_exemplar_sets_prompted_cells_are_set_beside_figure_3s_with_the_gap(tmp_path):
    """exemplar_comparison: prompted evals with another exemplar set (a grid's compare_exemplars) go
    to exemplars.md beside figure 3's cell of the same model and method, with Newcombe's interval
    of the gap; figure 3's table and orderings never see them."""
    from pipeline.report.summaries import em_gap_interval

    figure_rows = [dict(r, exemplars="ours") if r["mode"] == "prompt" else r for r in PAPER_LIKE]
    paper = [dict(row("M-8B", "8b", 8.0, "prompt", "react", 0.40, n=500), exemplars="paper"),
             dict(row("M-8B", "8b", 8.0, "prompt", "standard", 0.10, n=500), exemplars="paper")]
    summary = write_summary(tmp_path / "summary.json", figure_rows)
    other = write_summary(tmp_path / "paper.json", paper)
    out = tmp_path / "plot"
    paths = run_plot(PlotConfig(summaries=[str(summary)], exemplar_comparison=[str(other)], out_dir=str(out),
                                reference_points=False))
    text = paths["exemplars"].read_text()
    react8 = next(r for r in figure_rows if (r["model"], r["mode"], r["method"]) == ("M-8B", "prompt", "react"))
    low, high = em_gap_interval(paper[0], react8)
    assert (f"| M-8B | 8b | ReAct | ours | {100 * react8['em']:.1f} [" in text
            and f"| paper | 40.0 [35.8, 44.4] (500) | {100 * (0.40 - react8['em']):+.1f} "
                f"[{100 * low:+.1f}, {100 * high:+.1f}] |" in text)
    assert text.index("| Standard |") < text.index("| ReAct |")  # the figure's method order
    plain = run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "plain"), reference_points=False))
    assert "exemplars" not in plain
    for kind in ("md", "csv", "orderings"):  # figure 3's tables and checks: as without the comparison
        assert paths[kind].read_text() == plain[kind].read_text()


def test_students_on_the_stand_ins_data_are_set_beside_the_same_sizes_fine_tuned_cells_with_the_gap(tmp_path):
    """oracle_data_comparison: the evals of students trained on the stand-in's data (a grid's
    compare_oracle) go to teachers.md, each beside the fine-tuned cell of the student of its name
    (the model teacher's data; never another student of the same size), with the gap's Newcombe
    interval and each side's precision; figure 3's outputs never see them."""
    from pipeline.report.summaries import em_gap_interval

    trained = {"precision": "bf16", "train_precision": "fp32"}
    stand_in = [dict(row("M-8B-oracle-data", "8b", 8.0, "finetune", "react", 0.25), **trained),
                dict(row("M-8B-oracle-data", "8b", 8.0, "finetune", "standard", 0.30), **trained)]
    # a second 8B student listed first: the pairing goes by name, not by size
    figure_rows = [row("N-8B", "8b", 8.0, "finetune", "react", 0.05),
                   *(dict(r, **trained) if r["mode"] == "finetune" else r for r in PAPER_LIKE)]
    summary = write_summary(tmp_path / "summary.json", figure_rows)
    other = write_summary(tmp_path / "oracle-data.json", stand_in)
    paths = run_plot(PlotConfig(summaries=[str(summary)], oracle_data_comparison=[str(other)],
                                out_dir=str(tmp_path / "plot"), reference_points=False))
    text = paths["teachers"].read_text()
    own = next(r for r in PAPER_LIKE if (r["size_class"], r["mode"], r["method"]) == ("8b", "finetune", "react"))
    low, high = em_gap_interval(own, stand_in[0])
    assert (f"| 8b | ReAct | M-8B [fp32-trained bf16] | 31.0 [28.2, 33.9] (1000) | "
            f"M-8B-oracle-data [fp32-trained bf16] | "
            f"25.0 [22.4, 27.8] (1000) | +6.0 [{100 * low:+.1f}, {100 * high:+.1f}] |") in text
    assert "N-8B" not in text
    assert text.index("| Standard |") < text.index("| ReAct |")
    summary = write_summary(tmp_path / "summary.json", PAPER_LIKE)  # figure 3 without the comparison: unchanged
    paths = run_plot(PlotConfig(summaries=[str(summary)], oracle_data_comparison=[str(other)],
                                out_dir=str(tmp_path / "plot"), reference_points=False))
    plain = run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "plain"), reference_points=False))
    assert "teachers" not in plain
    for kind in ("md", "csv", "orderings"):
        assert paths[kind].read_text() == plain[kind].read_text()


@pytest.mark.skipif(not FIREACT_TRAJS.is_dir(), reason="FireAct data not present")
def test_fireact_runs_as_reference_points(tmp_path, capsys):
    summary = write_summary(tmp_path / "summary.json", [dict(r, question_set="react-dev500") for r in PAPER_LIKE])
    paths = run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "plot"), fireact_runs=[str(FIREACT_TRAJS)]))
    runs = [r for r in csv.DictReader(paths["csv"].open()) if r["model"].endswith(" run")]
    assert {(r["model"], r["em_pct"]) for r in runs} == {("Llama-2-7B (FireAct LoRA) run", "26.2"),
                                                         ("Llama-2-13B (FireAct LoRA) run", "34.47")}
    assert "has no published size; not plotted" in capsys.readouterr().out


def test_bad_summaries_are_clear_errors(tmp_path):
    out = tmp_path / "plot"

    def fails(rows, match, **kw):
        summary = write_summary(tmp_path / "s.json", rows)
        with pytest.raises(PipelineError, match=match):
            run_plot(PlotConfig(summaries=[str(summary)], out_dir=str(out), **kw))

    fails([], "empty")
    fails(PAPER_LIKE[:2] + [row("X", "8b", 8.0, "prompt", "act", 0.2, question_set="react-dev500")],
          "different question sets")
    fails([row("X", "huge", None, "prompt", "react", 0.2)], "unknown size class 'huge' and no params_b")
    fails([row("X", "8b", 8.0, "prompt", "react", 20.0)], "fraction")
    fails([row("X", "8b", 8.0, "zero-shot", "react", 0.2)], "mode")
    fails([row("X", "8b", 8.0, "prompt", "react", 0.2)] * 2, "repeats")
    with pytest.raises(PipelineError, match="no summaries"):
        run_plot(PlotConfig(out_dir=str(out)))
    with pytest.raises(PipelineError, match="not found"):
        load_summaries([tmp_path / "missing.json"])
    assert not out.exists()  # nothing half-written
    mixed = write_summary(tmp_path / "m.json", PAPER_LIKE[:4] + [row("X", "8b", 8.0, "finetune", "act", 0.2, "react-dev500")])
    assert run_plot(PlotConfig(summaries=[str(mixed)], out_dir=str(out), allow_mixed_question_sets=True))["png"].exists()


def test_a_summary_whose_eval_manifest_says_incomplete_is_refused(tmp_path):
    from pipeline.core.storage import write_manifest

    (tmp_path / "eval").mkdir()
    summary = write_summary(tmp_path / "eval" / "summary.json", PAPER_LIKE)
    write_manifest(summary.parent / "manifest.json", stage="eval", config={}, complete=False)
    cfg = PlotConfig(summaries=[str(summary)], out_dir=str(tmp_path / "plot"))
    with pytest.raises(PipelineError, match="incomplete"):
        run_plot(cfg)
    assert not (tmp_path / "plot").exists()
    write_manifest(summary.parent / "manifest.json", stage="eval", config={}, complete=True)
    assert run_plot(cfg)["png"].exists()


def test_size_class_gives_params_when_missing():
    assert validate_row(row("S", "135M", None, "prompt", "react", 0.1), "r")["params_b"] == pytest.approx(0.135)
    assert validate_row(row("S", "", 1.7, "prompt", "react", 0.1), "r")["size_class"] == "1.7b"


def test_cli_exit_codes(tmp_path):
    summary = write_summary(tmp_path / "summary.json", PAPER_LIKE)
    run = [sys.executable, "-m", "pipeline", "plot"]
    proc = subprocess.run([*run, f"summaries=[{summary}]", f"out_dir={tmp_path / 'plot'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "plot" / "figure3.png").exists() and "orderings" in proc.stdout
    empty = write_summary(tmp_path / "empty.json", [])
    proc = subprocess.run([*run, f"summaries=[{empty}]", f"out_dir={tmp_path / 'plot2'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "empty" in proc.stderr


def test_one_student_evaluated_in_a_grid_and_alone_gets_one_tick_and_one_x(tmp_path):
    """A grid's eval states SmolLM2-135M's size (0.135); `eval` of a final/ alone reads its manifest's
    count (0.134515008): the figure drew two overlapping ticks ("135M" over "134.515M") for one
    student. Rows of one size class within 2% share the first row's x; other models stay apart."""
    from pipeline.report.summaries import one_x_per_size

    tuned = row("S (fine-tuned)", "135m", 0.135, "finetune", "react", 0.04, n=500)
    grpo = dict(row("S-grpo (GRPO)", "135m", 0.134515008, "finetune", "react", 0.042, n=500), training="grpo")
    paths = run_plot(PlotConfig(summaries=[str(write_summary(tmp_path / "a.json", [tuned])),
                                           str(write_summary(tmp_path / "b.json", [grpo]))],
                                out_dir=str(tmp_path / "plot"), reference_points=False))
    assert {r["params_b"] for r in csv.DictReader(paths["csv"].open())} == {"0.135"}
    svg = paths["svg"].read_text()
    assert "134.515M" not in svg and svg.count("<!-- 135M -->") == 1
    other = row("T", "8b", 7.6, "finetune", "react", 0.3, n=10)
    assert [r["params_b"] for r in one_x_per_size([row("L", "8b", 8.03, "finetune", "react", 0.3, n=10), other])] == \
        [8.03, 7.6]
