"""The figure: two panels (prompting, fine-tuning); x = model size in billions of parameters (log
scale); y = the task's metric (%). Each method is drawn as its registry row says
(pipeline.methods.registry: a line across sizes with each point's 95% Wilson interval as an error
bar, or points), in its colour and marker; every method in the rows is drawn (one without a row
is an error, never left out). Reference points are hollow and labelled; released agents
evaluated here are filled plus markers labelled with their own name, apart from our lines; our
GRPO students (rows with `training: grpo`) are triangles with their intervals, beside the
fine-tuned points of their size.
matplotlib (Agg backend) is imported only when drawing.

    fig = draw_figure(rows, references, "HotpotQA EM", task); save_figure(fig, Path("f.png"), "png")
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from pipeline.core.storage import atomic_path
from pipeline.methods.registry import METHODS, in_figure_order, method_spec
from pipeline.report.summaries import MODES, em_interval, is_grpo, method_label
from pipeline.tasks import Task, get_task


def draw_figure(rows: list[dict], references: list[dict], title: str, task: Task | None = None):
    """The two-panel figure; returns the matplotlib Figure (Agg backend, no display needed)."""
    task = get_task(task)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    top = max([100 * (em_interval(r) or (0, r["em"]))[1] for r in [*rows, *references]] + [10.0])
    released = [r for r in rows if r.get("released")]
    grpo = [r for r in rows if is_grpo(r)]
    for ax, (mode, panel) in zip(axes, MODES.items(), strict=True):
        mode_rows = [r for r in rows if r["mode"] == mode and not r.get("released") and not is_grpo(r)]
        _draw_methods(ax, mode_rows)
        mode_refs = [r for r in references if r["mode"] == mode]
        _draw_references(ax, mode_refs)
        mode_released = [r for r in released if r["mode"] == mode]
        _draw_released(ax, mode_released)
        mode_grpo = [r for r in grpo if r["mode"] == mode]
        _draw_grpo(ax, mode_grpo)
        mode_released += mode_grpo  # for the ticks and the "no runs" note: drawn, not on a line
        ours = sorted({r["params_b"] for r in mode_rows} | {r["params_b"] for r in mode_released})
        everything = sorted({*ours, *(r["params_b"] for r in mode_refs)})
        ax.set_xscale("log")
        if everything:
            # ticks name our sizes only; a reference point's label carries its own size
            ax.set_xticks(ours, [_tick(x) for x in ours])
            ax.minorticks_off()
            ax.set_xlim(everything[0] / 1.8, everything[-1] * 2.5)
        ax.set_title(panel)
        ax.set_xlabel("model size (parameters, log scale)")
        ax.grid(alpha=0.3)
        if not mode_rows and not mode_released:
            ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", color="gray")
    axes[0].set_ylabel(f"{task.title} {task.metric_label} (%)")
    axes[0].set_ylim(-1.5, top * 1.15 + 2)  # below 0 so points at EM 0 are not cut
    handles = _legend_handles(rows, references, bool(released), bool(grpo))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.03), ncol=min(len(handles), 6),
               fontsize=8, frameon=False)
    if references:
        fig.text(0.995, 0.005, "hollow/x markers: published results on other question sets and tools "
                 "(ReAct: PaLM + Wikipedia API; FireAct: Google search), not runs of this pipeline",
                 ha="right", va="bottom", fontsize=6, color="gray")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def _draw_methods(ax, rows: list[dict]) -> None:
    """Every method of `rows` (our students and prompted models), as its registry row says."""
    lines = [spec for spec in METHODS if spec.line]
    for spec in in_figure_order(r["method"] for r in rows):
        method_rows = [r for r in rows if r["method"] == spec.name]
        if spec.line:
            method_rows.sort(key=lambda r: r["params_b"])  # a line runs left to right
            # a small multiplicative offset per line keeps equal EMs at one size visible
            dodge = 1.07 ** (lines.index(spec) - (len(lines) - 1) / 2)
            xs, ys = [r["params_b"] * dodge for r in method_rows], [100 * r["em"] for r in method_rows]
            ax.errorbar(xs, ys, yerr=_error_bars(method_rows), marker=spec.marker, color=spec.color,
                        label=spec.label, capsize=3, elinewidth=1)
        else:
            points = [(r["params_b"], 100 * r["em"]) for r in method_rows]
            ax.scatter(*zip(*points, strict=True), marker=spec.marker, s=45, color=spec.color,
                       label=spec.label, zorder=3)


def _legend_handles(rows: list[dict], references: list[dict], any_released: bool, any_grpo: bool = False) -> list:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=spec.color, marker=spec.marker, label=spec.label,
                      **({} if spec.line else {"linestyle": "none"}))
               for spec in in_figure_order(r["method"] for r in [*rows, *references])]
    if any_released:
        handles.append(Line2D([], [], color="black", marker=RELEASED_MARKER, linestyle="none",
                              label="released fine-tuned agent, evaluated here"))
    if any_grpo:
        handles.append(Line2D([], [], color="black", marker=GRPO_MARKER, linestyle="none",
                              label="fine-tuned, then GRPO in the environment"))
    kinds = {_ref_kind(r) for r in references}
    handles += [Line2D([], [], color="black", marker=mk, markerfacecolor="none", linestyle="none", label=lab)
                for src, mk, lab in REFERENCE_STYLES if src in kinds]
    return handles


def _error_bars(rows: list[dict]) -> list[list[float]]:
    """[below, above] distances (EM points) to each row's 95% Wilson interval; 0 where n is unknown."""
    below, above = [], []
    for row in rows:
        ci = em_interval(row) or (row["em"], row["em"])
        below.append(max(0.0, 100 * (row["em"] - ci[0])))  # em * n may round: never a negative bar
        above.append(max(0.0, 100 * (ci[1] - row["em"])))
    return [below, above]


# (kind, marker, legend text); a released run recomputed here is kind "fireact-run"
REFERENCE_STYLES = (("paper", "*", "ReAct paper, published"), ("fireact", "D", "FireAct, published"),
                    ("fireact-run", "x", "FireAct released run, EM recomputed"))


def _ref_kind(ref: dict) -> str:
    return "fireact-run" if ref.get("file") else ref["source"]


def _draw_references(ax, refs: list[dict]) -> None:
    """Hollow markers in the method's colour; one label per reference model, beside its top point."""
    markers = {kind: marker for kind, marker, _ in REFERENCE_STYLES}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for ref in refs:
        kind = _ref_kind(ref)
        color = method_spec(ref["method"]).color
        style = {"color": color} if markers[kind] == "x" else {"facecolors": "none", "edgecolors": color}
        ax.scatter([ref["params_b"]], [100 * ref["em"]], marker=markers[kind], s=80, linewidths=1.4, zorder=4, **style)
        groups[(ref["params_b"], _base_model(ref["model"]))].append(ref)
    for (params_b, model), members in groups.items():
        top = max(members, key=lambda r: r["em"])
        label = model if len(members) > 1 and len({m["method"] for m in members}) > 1 else f"{model} {method_label(top)}"
        ax.annotate(label, (params_b, 100 * top["em"]), textcoords="offset points", xytext=(7, 4), fontsize=7)


RELEASED_MARKER = "P"  # filled plus: a checkpoint trained elsewhere, run through our environment here


def _draw_released(ax, rows: list[dict]) -> None:
    """Each released agent's point, in its method's colour, labelled with its own name;
    never joined into our students' lines."""
    for row in rows:
        ax.scatter([row["params_b"]], [100 * row["em"]], marker=RELEASED_MARKER, s=90, zorder=5,
                   color=method_spec(row["method"]).color, edgecolors="black", linewidths=0.6)
        ax.annotate(row["model"], (row["params_b"], 100 * row["em"]), textcoords="offset points",
                    xytext=(7, -10), fontsize=7)


GRPO_MARKER = "^"  # the third kind of point: a student of ours fine-tuned, then trained by GRPO
GRPO_DODGE = 1.15  # drawn just right of the fine-tuned point at its size, never joined to its line


def _draw_grpo(ax, rows: list[dict], dodge: float = GRPO_DODGE) -> None:
    """Each GRPO student's point in its method's colour, with its 95% Wilson interval as an error bar."""
    for row in rows:
        ax.errorbar([row["params_b"] * dodge], [100 * row["em"]], yerr=_error_bars([row]), marker=GRPO_MARKER,
                    markersize=8, color=method_spec(row["method"]).color, markeredgecolor="black",
                    linestyle="none", capsize=3, elinewidth=1, zorder=5)


def _base_model(model: str) -> str:
    """"Llama-2-7B (FireAct LoRA) run" -> "Llama-2-7B": a published point and a recomputed run share a label."""
    return re.sub(r"\s*\(.*$", "", model)


def _tick(params_b: float) -> str:
    return f"{params_b * 1000:g}M" if params_b < 1 else f"{params_b:g}B"


def save_figure(fig, path: Path, fmt: str) -> None:
    import matplotlib

    # no timestamps and fixed SVG ids, so a re-plot of the same data gives the same bytes
    with atomic_path(path) as tmp, matplotlib.rc_context({"svg.hashsalt": "react-pipeline"}):
        fig.savefig(tmp, format=fmt, dpi=150, metadata={"Date": None} if fmt == "svg" else {"Software": None})


# ---------------------------------------------------------------- sizes on the x axis

ROUND_MARKER = "s"  # a self-training round's student (pipeline/rounds.py)
# Offsets from a point's size, in steps of 1/30 of the log distance between the closest two sizes
# (a 2x step and a 9x step look alike): the lines' +-1..4 steps (prompted left, fine-tuned right),
# the GRPO triangle at 5.5, round k's square at 5.5 + k; each stays well inside its size's third.
STEPS_PER_GAP = 30
GRPO_STEP = 5.5
PROMPTED_STYLE = {"linestyle": "--", "markerfacecolor": "white"}  # prompted: dashed, hollow
TUNED_STYLE = {"linestyle": "-"}  # fine-tuned: solid, filled


def draw_sizes_figure(rows: list[dict], extra: list[dict], references: list[dict], title: str, task: Task | None = None):
    """The figure for summaries of more than one model size: on one axis, x = parameters (log
    scale), per method a dashed line prompted and a solid line fine-tuned, each point with its 95%
    Wilson interval; GRPO and self-training students (`extra`) as triangles and squares beside the
    fine-tuned point of their size; released agents as plus markers. Published points, whose
    models, scale and setup differ, get a panel of their own, never our axis."""
    task = get_task(task)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if references else 1
    fig, axes = plt.subplots(1, panels, figsize=(7.5 + 4 * (panels - 1), 5.2), squeeze=False,
                             gridspec_kw={"width_ratios": [2, 1][:panels]})
    ax = axes[0][0]
    ours = [r for r in rows if not r.get("released")]
    sizes = sorted({r["params_b"] for r in ours})
    step = size_step(sizes)
    _draw_size_lines(ax, ours, step)
    _draw_released(ax, [r for r in rows if r.get("released")])
    _draw_grpo(ax, [r for r in extra if is_grpo(r)], step ** GRPO_STEP)
    _draw_rounds(ax, [r for r in extra if not is_grpo(r)], step)
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{_tick(s)}\n{_model_at(ours, s)}" for s in sizes], fontsize=7)
    ax.minorticks_off()
    everything = sorted({*sizes, *(r["params_b"] for r in rows)})
    ax.set_xlim(everything[0] / step ** 10, everything[-1] * step ** 14)  # room for the labels on the right
    ax.set_ylim(bottom=-1.0)
    ax.set_title("this pipeline: prompted (dashed) vs fine-tuned (solid)", fontsize=10)
    ax.set_xlabel("model size (parameters, log scale)")
    ax.set_ylabel(f"{task.title} {task.metric_label} (%)")
    ax.grid(alpha=0.3)
    if references:
        ref_ax = axes[0][1]
        _draw_references(ref_ax, references)
        ref_sizes = sorted({r["params_b"] for r in references})
        ref_ax.set_xscale("log")
        ref_ax.set_xticks(ref_sizes, [_tick(s) for s in ref_sizes], fontsize=7)
        ref_ax.minorticks_off()
        ref_ax.set_xlim(ref_sizes[0] / 1.8, ref_sizes[-1] * 3)
        ref_ax.set_title("published (other models, questions, tools)", fontsize=10)
        ref_ax.set_xlabel("model size (parameters, log scale)")
        ref_ax.grid(alpha=0.3)
    handles = _sizes_legend(rows, extra, references)
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.01), ncol=min(len(handles), 4),
               fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.03 + 0.035 * -(-len(handles) // 4), 1, 1))
    return fig


def size_step(sizes: list[float]) -> float:
    """The figure's unit offset (a factor on the log x axis): 1/30 of the closest two sizes' distance."""
    closest = min(b / a for a, b in zip(sizes, sizes[1:], strict=False))
    return closest ** (1 / STEPS_PER_GAP)


def _draw_size_lines(ax, rows: list[dict], step: float) -> None:
    """Per method, prompted and fine-tuned, left to right by size; a small offset per line keeps
    equal EMs and their intervals apart (prompted left of the size, fine-tuned right of it)."""
    specs = in_figure_order(r["method"] for r in rows)
    for k, spec in enumerate(specs):
        for mode, style, side in (("prompt", PROMPTED_STYLE, -1), ("finetune", TUNED_STYLE, 1)):
            line = sorted((r for r in rows if r["method"] == spec.name and r["mode"] == mode), key=lambda r: r["params_b"])
            if not line:
                continue
            dodge = step ** (side * (k + 1))
            xs, ys = [r["params_b"] * dodge for r in line], [100 * r["em"] for r in line]
            ax.errorbar(xs, ys, yerr=_error_bars(line), marker=spec.marker, color=spec.color, capsize=3,
                        elinewidth=1, markersize=6, **(style if spec.line else {**style, "linestyle": "none"}))


def _draw_rounds(ax, rows: list[dict], step: float) -> None:
    """Each self-training round's student beside the fine-tuned point of its size, with its interval."""
    for row in rows:
        number = _round_number(row)
        x = row["params_b"] * step ** (GRPO_STEP + (number or 1))
        ax.errorbar([x], [100 * row["em"]], yerr=_error_bars([row]), marker=ROUND_MARKER, markersize=6,
                    color=method_spec(row["method"]).color, markeredgecolor="black", linestyle="none", capsize=3,
                    elinewidth=1, zorder=5)
        ax.annotate(f"round {number}" if number else row["model"], (x, 100 * row["em"]), textcoords="offset points",
                    xytext=(5, 3), fontsize=6)


def _round_number(row: dict) -> int | None:
    """k of a round-k student's label (pipeline/stages/grid/unit_configs.py eval_config names it `<student> round k (...)`)."""
    match = re.search(r"\bround (\d+)\b", row["model"])
    return int(match.group(1)) if match else None


def _model_at(rows: list[dict], size: float) -> str:
    """The tick's model name: the prompted base model at that size (else the first fine-tuned one)."""
    at = sorted((r["mode"] != "prompt", r["model"]) for r in rows if r["params_b"] == size)
    return at[0][1] if at else ""


def _sizes_legend(rows: list[dict], extra: list[dict], references: list[dict]) -> list:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=spec.color, marker=spec.marker, label=spec.label, linestyle="none")
               for spec in in_figure_order(r["method"] for r in [*rows, *references])]
    handles += [Line2D([], [], color="black", marker="o", label="prompted", **PROMPTED_STYLE),
                Line2D([], [], color="black", marker="o", label="fine-tuned", **TUNED_STYLE)]
    if any(is_grpo(r) for r in extra):
        handles.append(Line2D([], [], color="black", marker=GRPO_MARKER, linestyle="none",
                              label="fine-tuned, then GRPO in the environment"))
    if any(not is_grpo(r) for r in extra):
        handles.append(Line2D([], [], color="black", marker=ROUND_MARKER, linestyle="none",
                              label="self-training round (its own trajectories)"))
    if any(r.get("released") for r in rows):
        handles.append(Line2D([], [], color="black", marker=RELEASED_MARKER, linestyle="none",
                              label="released fine-tuned agent, evaluated here"))
    kinds = {_ref_kind(r) for r in references}
    handles += [Line2D([], [], color="black", marker=mk, markerfacecolor="none", linestyle="none", label=lab)
                for src, mk, lab in REFERENCE_STYLES if src in kinds]
    return handles
