"""Episodes of a prompted model (or a stand-in teacher) acting in the environment, for `generate`
and `eval`: the scheduler that runs many at once (scheduler.py), who answers them (answerers.py),
their per-method record files (episodes.py), the run folder they live in (run_folder.py), and how
they searched (search_stats.py)."""
