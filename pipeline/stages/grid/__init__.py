"""The parts of `run` (pipeline/stages/run.py), the grid of units it plans, checks and runs:

- spec.py: what a grid's YAML says (RunConfig, its students, its `grpo` section);
- unit.py: a unit and the phases units run in;
- unit_configs.py: each unit's stage config, built from the grid's sections;
- plan.py: every unit of a grid, in phase order, checked before anything runs;
- checks.py: what the plan and the machine must allow before the first unit;
- precision.py: the precision each unit computes in, and results made in another;
- children.py: how a unit runs (its own process, a launch) and when it is skipped.
"""
