"""What `plot` makes of eval's summaries, one module per concern (the stage itself,
pipeline/stages/plot.py, only reads its config and calls these):

  summaries.py   read, validate and merge summary rows (shard sets), one task and question set
  orderings.py   the paper's five figure-3 orderings, judged with Newcombe's intervals
  tables.py      results.csv and results.md
  figure.py      the two-panel figure (matplotlib, imported only when drawing)
  intervals.py   Wilson's interval for a rate, Newcombe's for the gap between two
  references.py  the published points (each task's `reference_rows` reads them) and the orderings' text

How each method is named and drawn is its row in pipeline.methods.registry. Nothing here
imports a stage or a training or inference library (tests/test_layout.py).
"""
