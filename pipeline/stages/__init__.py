"""One module per CLI stage (`python -m pipeline <stage>`), each with `add_arguments` and a short `main`.

Stages are siblings: none imports another, except `run`, which orchestrates them through their
config classes and public entry functions only (`generate`, `run_filter`, `train`, `grpo`, `evaluate`,
`run_plot`). What two stages share lives one floor down (episodes, storage, config).
"""
