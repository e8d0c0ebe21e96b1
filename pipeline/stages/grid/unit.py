"""One unit of a grid (a generate run, a dataset, a training, an eval, a plot) and the phases units run in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The order units run in, and the names --only / --from / --until take.
PHASES = {
    "teacher": "generate, and the teacher's own prompted eval (while the teacher is served)",
    "filter": "correct trajectories -> SFT datasets (CPU)",
    "train": "every student x format training (accelerate launch)",
    "grpo": "GRPO of the grid's fine-tuned students, when the `grpo` section names formats (accelerate launch); "
            "with grpo.from_round N > 1, round N's students instead, in the rounds phase",
    "eval": "every other eval: prompted students, fine-tuned students, released agents",
    "rounds": "self-training rounds 2..N (self_training:), each: the last student generates, filter, train, eval",
    "plot": "figure 3, the table and the orderings check",
}


@dataclass
class Unit:
    """One step of the grid: its title, its stage config, and how to run it."""

    title: str
    config: Any
    action: Any  # callable(config) -> result
    phase: str = ""  # a PHASES name
    needs: str = ""  # the model it needs and where (the plan prints it)
    selected: bool = True  # False: listed in the plan, never run
    # The precision record this unit would compute in, for a unit whose results carry one (the
    # same call skip_or / launch_train make); None for units without a precision
    precision: Any = None
    # An eval unit with `serve:`: the model its server loads, (base model, LoRA adapter or None);
    # units that need the same server share one (pipeline/llm/serve_groups.py sets `group`)
    serves: tuple[str, str | None] | None = None
    group: Any = None
    # Units share a server only within one scope of a phase: a round's eval and the next round's
    # generate, not the training between them (pipeline/llm/serve_groups.py)
    scope: str = ""
