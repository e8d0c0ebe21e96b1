"""Reproduce the ReAct paper's fine-tuning experiment (Yao et al. 2022) with open models.

Stages: data, wiki, generate, filter, train, eval, plot, run (see `python -m pipeline --help`).
"""

__version__ = "0.1.0"
