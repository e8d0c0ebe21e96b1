"""Sharding a question set over N jobs (N nodes, or a SLURM job array), and merging the N folders.

    python -m pipeline generate ... shard=0/4 out_dir=runs/gen/x/shard-0    # on node 0
    python -m pipeline generate ... shard=3/4 out_dir=runs/gen/x/shard-3    # on node 3
    python -m pipeline filter inputs=[runs/gen/x/shard-0,...,runs/gen/x/shard-3] ...

`shard=i/n` (0 <= i < n) keeps the questions at positions i, i+n, i+2n, ... of the set (after
`limit`): the shards are disjoint, together they are the whole set, their sizes differ by at most
one, and a question's shard depends only on its position, so a larger `limit` keeps every
question where it was. Each shard is an ordinary run folder (its own manifest, lock, resume).
`filter` merges a generate shard set and `plot` an eval shard set, refusing an incomplete one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.core.errors import PipelineError

_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
EXAMPLE = "e.g. shard=0/4 ... shard=3/4 (in a SLURM job array: shard=$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)"


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(spec: str | None) -> Shard | None:
    """`"i/n"` -> Shard(i, n); None -> None (the whole set); anything else: a one-line error."""
    if spec is None:
        return None
    match = _SPEC.fullmatch(str(spec))
    if not match:
        raise PipelineError(f"shard '{spec}' is not i/n (shard i of n, counted from 0); {EXAMPLE}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 0 <= index < count:
        raise PipelineError(f"shard '{spec}' is out of range: i/n needs n >= 1 and 0 <= i < n; {EXAMPLE}")
    return Shard(index, count)


def shard_questions(questions: list, shard: Shard | None) -> list:
    """This shard's questions (module docstring); the whole list when `shard` is None."""
    if shard is None:
        return questions
    mine = questions[shard.index::shard.count]
    if not mine:
        raise PipelineError(f"shard {shard} holds no question: the set has only {len(questions)}; "
                            f"use at most {len(questions)} shards")
    return mine


def check_shard_set(shards: list[tuple[Shard, str]], what: str) -> None:
    """Refuse a shard set that is not exactly shards 0..n-1 of one n (`shards`: (shard, where))."""
    counts = sorted({s.count for s, _ in shards})
    if len(counts) > 1:
        raise PipelineError(f"{what}: shards of different counts ({', '.join(f'{s} in {w}' for s, w in shards)}); "
                            "merge one shard set at a time")
    count = counts[0]
    seen: dict[int, str] = {}
    for shard, where in shards:
        if shard.index in seen:
            raise PipelineError(f"{what}: shard {shard} is given twice ({seen[shard.index]} and {where}); keep one")
        seen[shard.index] = where
    missing = [f"{i}/{count}" for i in range(count) if i not in seen]
    if missing:
        raise PipelineError(f"{what}: shard set incomplete: missing {', '.join(missing)} "
                            f"(have {', '.join(f'{s} in {w}' for s, w in sorted(shards, key=lambda x: x[0].index))}); "
                            "run the missing shards (or add their folders) first")
