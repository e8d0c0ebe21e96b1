"""One module per CLI stage (`python -m pipeline <stage>`), each with `add_arguments` and a short `main`.

Stages are siblings: none imports another; `run` starts the others through their public functions
only, and shared plumbing lives one floor down (episodes, storage, config).
"""
