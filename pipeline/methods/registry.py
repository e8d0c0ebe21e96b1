"""The prompting methods, one row each: everything the stages, the figure and the tables know
about a method by its name. A new method is its module plus one row here; `eval`, `generate`
and `plot` refuse a name without a row (tests/test_plot.py draws every row).

    method_spec("react_to_cot_sc").formats   # ("react", "cot"): the prefixes it is built from
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pipeline.core.errors import PipelineError
from pipeline.methods.base import Method
from pipeline.methods.composed import SelfConsistency, cot_sc_then_react, react_then_cot_sc
from pipeline.methods.direct import Direct
from pipeline.methods.interactive import Interactive
from pipeline.methods.rag import Rag


@dataclass(frozen=True)
class MethodSpec:
    name: str  # the config value and the records' `method`
    formats: tuple[str, ...]  # the trajectory formats (pipeline.core.trajectory.FORMATS) it prompts with
    # called with the prompt prefix of each of `formats`, in that order, then settings and task
    build: Callable[..., Method]
    label: str  # how the figure and the tables name it
    color: str  # its colour in the figure (reference points and released agents too)
    marker: str  # its matplotlib marker in the figure and the legend
    line: bool  # True: one line across sizes with error bars (figure 3's four); False: points


# Registry order is the figure's and the tables' order (lines first) and the order names are listed in.
METHODS: tuple[MethodSpec, ...] = (
    MethodSpec("standard", ("standard",), Direct, "Standard", "#7f7f7f", "o", line=True),
    MethodSpec("cot", ("cot",), Direct, "CoT", "#1f77b4", "o", line=True),
    MethodSpec("cot_sc", ("cot",), SelfConsistency, "CoT-SC", "#9467bd", "s", line=False),
    MethodSpec("act", ("act",), Interactive, "Act", "#ff7f0e", "o", line=True),
    MethodSpec("react", ("react",), Interactive, "ReAct", "#d62728", "o", line=True),
    MethodSpec("react_to_cot_sc", ("react", "cot"), react_then_cot_sc, "ReAct→CoT-SC", "#8c564b", "s", line=False),
    MethodSpec("cot_sc_to_react", ("cot", "react"), cot_sc_then_react, "CoT-SC→ReAct", "#e377c2", "s", line=False),
    # the field's retrieval baseline (wiki.search=bm25 only): one retrieval with the question, then an answer
    MethodSpec("rag", ("standard",), Rag, "RAG (1 retrieval)", "#2ca02c", "D", line=False),
)


def method_spec(name: str) -> MethodSpec:
    """The row of method `name`; an unknown name is an error that lists the known ones."""
    for spec in METHODS:
        if spec.name == name:
            return spec
    raise PipelineError(f"unknown method '{name}'; expected one of {', '.join(s.name for s in METHODS)}")


def figure_rank(name: str) -> tuple[bool, int]:
    """Where method `name` stands in the figure's and the tables' order: lines first, then
    registry order (an unknown name is an error)."""
    spec = method_spec(name)
    return not spec.line, METHODS.index(spec)


def in_figure_order(names: Iterable[str]) -> list[MethodSpec]:
    """The rows of these method names, each once, in figure order (an unknown name is an error)."""
    return [method_spec(name) for name in sorted(set(names), key=figure_rank)]
