"""Plot: eval summaries -> the paper's figure 3 (prompting vs fine-tuning by model size), a CSV,
a Markdown table, and a check of the five orderings the paper states about that figure.

    python -m pipeline plot --config configs/demo.yaml
    python -m pipeline plot summaries=[runs/eval/demo/summary.json] out_dir=runs/plot/demo
    python -m pipeline plot summaries=[a.json,b.json] fireact_runs=[../shared/data/fireact/trajs]

Two panels (prompting, fine-tuning); x = model size in billions of parameters (log scale);
y = the task's metric (%: HotpotQA EM, FEVER accuracy; every summary must be of one task, a
row without `task` is HotpotQA's); one line per method (Standard, CoT, Act, ReAct), CoT-SC and the hybrids as
markers; each of our points carries its 95% Wilson interval over its n questions (an error bar,
and `EM [low, high]` in the table), and the orderings check calls a gap within noise when
Newcombe's 95% interval for it (built from the same two intervals) contains 0. Reference points (the task's: ReAct paper Table 1 at 540B, and for HotpotQA FireAct's Llama-2
numbers and FireAct's released runs when `fireact_runs` is set) are drawn hollow and labelled; they are not "our" data
and never enter the orderings check except where it says so. Rows of released agents
evaluated here (`released` in the row: eval of a model fine-tuned elsewhere) are drawn as
filled plus markers labelled with their own name, apart from our students' lines, and are not judged
by the orderings check; GRPO students' rows (`training: grpo`) are triangles with their intervals
beside the fine-tuned points of their size, a column of their own in the table, not judged either. Writes <name>.png, <name>.svg,
results.csv, results.md, orderings.md, orderings.json and manifest.json into out_dir, each by an
atomic rename; with `exemplar_comparison` (prompted evals with another exemplar set), exemplars.md;
with `oracle_data_comparison` (students trained on the stand-in teacher's data), teachers.md.

Summaries of more than one model size of ours (released agents aside) also get the figure with
sizes on its x axis, <name>-sizes.png / .svg (pipeline.report.figure.draw_sizes_figure: per method
a dashed prompted line and a solid fine-tuned one on one axis, the GRPO students and the
self-training rounds (`rounds`: their summaries) beside the fine-tuned point of their size, the
published points in a panel of their own), the table beside it, sizes.md (per size: prompted,
fine-tuned, the gain with Newcombe's interval), and the check across sizes (for each method, the
smaller model fine-tuned against the larger one prompted, with Newcombe's interval of the gap),
appended to orderings.md and written as across_sizes.json. One size: none of these, and every
other file exactly as before.

The rows of a sharded eval (`shard=i/n`, pipeline.core.shards) are merged into one row per model and
method (counts summed, rates weighted by each shard's question count); an incomplete shard set
is refused.

Rows use size_class "8b", "62b", "540b" for the paper's size classes (the orderings name them);
other classes ("135m", "7b") are plotted and checked where an ordering is stated per size.

The work is pipeline.report's (summaries, orderings, tables, figure); how each method is named
and drawn is its row in pipeline.methods.registry.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.config import (
    add_config_arguments,
    checked,
    folder_name,
    in_range,
    stage_config,
    to_dict,
)
from pipeline.core.errors import PipelineError
from pipeline.core.storage import (
    atomic_write_json,
    atomic_write_text,
    check_writable_dir,
    file_fingerprint,
    remove_stale_temps,
    write_manifest,
)
from pipeline.report.figure import draw_figure, draw_sizes_figure, save_figure
from pipeline.report.orderings import (
    across_sizes,
    across_sizes_text,
    check_orderings,
    model_sizes,
    orderings_text,
)
from pipeline.report.references import collect_references
from pipeline.report.summaries import (
    check_duplicates,
    check_question_sets,
    check_search_modes,
    check_task,
    is_grpo,
    label_precisions,
    load_summaries,
    one_x_per_size,
    search_of_row,
)
from pipeline.report.tables import (
    exemplars_markdown,
    results_csv,
    results_markdown,
    sizes_markdown,
    teachers_markdown,
)


@dataclass
class PlotConfig:
    summaries: list[str] = field(default_factory=list)  # summary.json files written by eval
    out_dir: str = "runs/plot"
    name: str = checked(folder_name, default="figure3")  # file stem of the figure
    title: str | None = None
    reference_points: bool = True  # ReAct paper Table 1 (540B) and FireAct's published numbers
    fireact_runs: list[str] = field(default_factory=list)  # FireAct trajs/*.json (or folder): recomputed points
    allow_mixed_question_sets: bool = False
    clear_margin: float = checked(in_range(0, 100), default=0.0)  # EM points by which ordering 5's "clearly below" must hold
    # summary.json files of self-training rounds 2..N (pipeline/rounds.py): points of the figure with
    # sizes on its x axis, beside the fine-tuned point of their size; figure 3 and its tables leave
    # them to the rounds report (rounds.md)
    rounds: list[str] = field(default_factory=list)
    # summary.json files of prompted evals with other exemplar sets than figure 3's (a grid's
    # `compare_exemplars`): exemplars.md sets each beside figure 3's cell; no figure shows them
    exemplar_comparison: list[str] = field(default_factory=list)
    # summary.json files of students trained on the stand-in teacher's data beside a model teacher's
    # (a grid's `compare_oracle`): teachers.md sets each beside the same size's fine-tuned cell of
    # that method; figure 3 and its tables keep the model teacher's students alone
    oracle_data_comparison: list[str] = field(default_factory=list)


def run_plot(cfg: PlotConfig) -> dict[str, Path]:
    """Write the figure, tables and orderings check; returns their paths by kind."""
    check_writable_dir(cfg.out_dir)
    rows = load_summaries(cfg.summaries)
    question_sets = check_question_sets(rows, cfg.allow_mixed_question_sets)
    task = check_task(rows)
    search = check_search_modes(rows)
    label_precisions(rows)
    check_duplicates(rows)
    references = collect_references(task, cfg.reference_points, cfg.fireact_runs)
    rounds = round_rows(cfg.rounds, task, question_sets)
    unified = one_x_per_size([*rows, *rounds])
    rows, rounds = unified[:len(rows)], unified[len(rows):]
    # The paper's orderings are about students trained by this recipe: released agents and GRPO students
    # are plotted, not judged; they are stated about HotpotQA only.
    ours = [r for r in rows if not r.get("released") and not is_grpo(r)]
    extra = [r for r in rows if is_grpo(r)] + rounds  # beside the lines
    results = check_orderings(ours, references, cfg.clear_margin) if task.states_orderings else []
    out = Path(cfg.out_dir)
    paths = {"png": out / f"{cfg.name}.png", "svg": out / f"{cfg.name}.svg", "csv": out / "results.csv",
             "md": out / "results.md", "orderings": out / "orderings.md", "orderings_json": out / "orderings.json"}
    remove_stale_temps(out)  # a killed run's half-written figure or tables
    title = cfg.title or f"{task.title} {task.metric_label}: prompting vs fine-tuning ({', '.join(question_sets)}; {search})"
    fig = draw_figure(rows, references, title, task)
    try:
        save_figure(fig, paths["png"], "png")
        save_figure(fig, paths["svg"], "svg")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    atomic_write_text(paths["csv"], results_csv(rows, references))
    atomic_write_text(paths["md"], results_markdown(rows, references, question_sets, task))
    text = orderings_text(results, task)
    if len(model_sizes(ours)) > 1:
        paths |= write_sizes(cfg, rows, extra, references, question_sets, task)
        gaps = across_sizes(ours)
        text += across_sizes_text(gaps)
        atomic_write_json(paths["across_sizes"], [g.to_dict() for g in gaps])
    else:
        remove_sizes_outputs(out, cfg.name)  # a multi-size plot's, from an earlier run into this folder
    atomic_write_text(paths["orderings"], text)
    atomic_write_json(paths["orderings_json"], [r.to_dict() for r in results])
    if cfg.exemplar_comparison:
        paths["exemplars"] = out / "exemplars.md"
        others = [row for row in load_summaries(cfg.exemplar_comparison) if row["mode"] == "prompt"]
        atomic_write_text(paths["exemplars"], exemplars_markdown(rows, others, task))
    if cfg.oracle_data_comparison:
        paths["teachers"] = out / "teachers.md"
        others = [row for row in load_summaries(cfg.oracle_data_comparison) if row["mode"] == "finetune"]
        atomic_write_text(paths["teachers"], teachers_markdown(rows, others, task))
    write_manifest(out / "manifest.json", stage="plot", config=to_dict(cfg), complete=True, task=task.name,
                   inputs=[file_fingerprint(p) for p in cfg.summaries], rows=len(rows),
                   references=len(references), outputs={k: str(v) for k, v in paths.items()},
                   orderings={r.number: r.verdict for r in results})
    print(results_markdown(rows, [], question_sets, task))
    print(text)
    print(f"figure: {paths['png']} and {paths['svg']}; table: {paths['md']}, {paths['csv']}")
    return paths


SIZES_OUTPUTS = {"sizes_png": "{name}-sizes.png", "sizes_svg": "{name}-sizes.svg", "sizes_md": "sizes.md",
                 "across_sizes": "across_sizes.json"}


def write_sizes(cfg: PlotConfig, rows: list[dict], extra: list[dict], references: list[dict],
                question_sets: list[str], task) -> dict[str, Path]:
    """The figure with sizes on its x axis and its table; returns every sizes output's path."""
    out = Path(cfg.out_dir)
    paths = {key: out / name.format(name=cfg.name) for key, name in SIZES_OUTPUTS.items()}
    search = search_of_row(rows[0]) if rows else "title"  # one mode per plot (check_search_modes)
    title = cfg.title or f"{task.title} {task.metric_label} by model size ({', '.join(question_sets)}; {search} search)"
    fig = draw_sizes_figure([r for r in rows if not is_grpo(r)], extra, references, title, task)
    try:
        save_figure(fig, paths["sizes_png"], "png")
        save_figure(fig, paths["sizes_svg"], "svg")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    ours = [r for r in rows if not r.get("released") and not is_grpo(r)]
    released = [r for r in rows if r.get("released")]
    text = sizes_markdown(ours, extra + released, question_sets, task)
    atomic_write_text(paths["sizes_md"], text)
    print(text)
    return paths


def round_rows(summaries: list[str], task, question_sets: list[str]) -> list[dict]:
    """The self-training rounds' rows, marked as such; of the plot's task and question sets."""
    rows = [dict(r, training="self-training") for r in load_summaries(summaries)] if summaries else []
    for row in rows:
        if check_task([row]).name != task.name or row["question_set"] not in question_sets:
            raise PipelineError(f"plot: {row['origin']} (rounds) is of {row['question_set']} / {check_task([row]).name}, "
                                f"the summaries of {', '.join(question_sets)} / {task.name}; plot them separately")
    return rows


def remove_sizes_outputs(out: Path, name: str) -> None:
    for pattern in SIZES_OUTPUTS.values():
        (out / pattern.format(name=name)).unlink(missing_ok=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, PlotConfig)


def main(args: argparse.Namespace) -> int:
    run_plot(stage_config(PlotConfig, args, section="plot"))
    return 0
