"""Durable outputs: atomic writes, torn JSONL tails, manifests that mark incomplete work."""

from __future__ import annotations

import json
import platform
from importlib import metadata

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.storage import (
    JsonlAppender,
    atomic_path,
    atomic_write_json,
    read_jsonl,
    require_complete,
    write_manifest,
)


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temp file left behind


def test_torn_tail_is_dropped_and_cut_on_append(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}\n{"id": 3, "tex')
    assert [r["id"] for r in read_jsonl(path)] == [1, 2]
    with JsonlAppender(path) as out:
        out.append({"id": 3})
    assert [r["id"] for r in read_jsonl(path, tolerate_torn_tail=False)] == [1, 2, 3]


def test_corruption_in_the_middle_names_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 1}\nnot json\n{"id": 3}\n')
    with pytest.raises(PipelineError, match=r"r.jsonl:2: not valid JSON"):
        read_jsonl(path)


def test_manifest_completion_is_enforced(tmp_path):
    manifest = tmp_path / "manifest.json"
    with pytest.raises(PipelineError, match="no manifest"):
        require_complete(manifest, "trajectories")
    write_manifest(manifest, stage="generate", config={"a": 1}, complete=False)
    with pytest.raises(PipelineError, match="incomplete"):
        require_complete(manifest, "trajectories")
    write_manifest(manifest, stage="generate", config={"a": 1}, complete=True, counts={"react": 3})
    got = require_complete(manifest, "trajectories")
    assert got["complete"] is True and got["counts"] == {"react": 3}
    # the versions that matter for reproducing a run are the installed ones
    assert got["packages"]["python"] == platform.python_version()
    for name in ("torch", "transformers"):
        assert got["packages"][name] == metadata.version(name), name
