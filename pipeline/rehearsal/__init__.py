"""The rehearsal (`run --config <grid> --rehearse`): a GPU grid's orchestration run on this CPU.

What each thing of the grid becomes on a CPU lives here, and only here: a model becomes a tiny
random model of the same architecture (models.py); the grid's config is rewritten into an
ordinary one that names those models, the local data and CPU launches, and says each
substitution (rewrite.py). The stages then run the rewritten config as they run any other.
"""
