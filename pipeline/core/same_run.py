"""What counts as the same run, declared on each field of a config that writes run folders
(dataclass field metadata, as TRL keeps its per-field facts), not in hand-kept key lists:

- identity: another value makes another run: a resumed folder refuses it, `run` does not skip it;
- target:   identity only in target mode (`generate`'s draw order);
- input:    what the run reads, checked by the files' fingerprints rather than by the value;
- free:     how, where, how fast or how much of the run is done, never what its records hold.

`shard_set=True` marks the keys all shards of one `generate` run share (its identity without
`shard`, plus `limit`, which cuts the set before it is split).

    task: str = same_run("identity", default="hotpotqa", shard_set=True)
    run_keys(GenerateConfig)            # ("task", "teacher", "questions", "prompting", "wiki", "shard")

tests/test_config.py fails on a field of such a config that says none of these.
"""

from __future__ import annotations

import dataclasses
from typing import Any

KINDS = ("identity", "target", "input", "free")
KEY = "same_run"


def same_run(kind: str, *, shard_set: bool = False, **field_kwargs) -> Any:
    """A dataclass field (`default=` / `default_factory=` / `metadata=` as for `dataclasses.field`)
    that says what its change does to a run; e.g. `metadata=bound(1)` (pipeline.core.config)."""
    if kind not in KINDS:
        raise ValueError(f"same_run: '{kind}' is not one of {', '.join(KINDS)}")
    metadata = {**field_kwargs.pop("metadata", {}), KEY: kind, "shard_set": shard_set}
    return dataclasses.field(metadata=metadata, **field_kwargs)


def run_keys(cls: type, *kinds: str) -> tuple[str, ...]:
    """The fields of `cls` of these kinds (default: identity), in declaration order."""
    kinds = kinds or ("identity",)
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(KEY) in kinds)


def shard_set_keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("shard_set"))


def unclassified(cls: type) -> list[str]:
    """Fields of `cls` that do not say what their change does to a run."""
    return [f.name for f in dataclasses.fields(cls) if f.metadata.get(KEY) not in KINDS]
