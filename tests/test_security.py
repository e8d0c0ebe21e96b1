"""Security of the generate / eval path: trust_remote_code only on request, YAML loaded safely,
model text never executed nor used as a path, API keys never written anywhere, and every output
file inside the run folder. Real processes, real files, the fake OpenAI server on 127.0.0.1.

    .venv/bin/python -m pytest tests/test_security.py -q
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from episode_testdata import (
    CORPUS,
    ScriptedTeacher,
    read_records,
    run_pipeline,
    write_questions,
)
from http_servers import FakeOpenAI

PLANTED = "sk-PLANTED-5e1f0c9a7b3d2468"

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")


@pytest.fixture(scope="module")
def questions():
    from pipeline.hotpotqa import load_question_set

    return load_question_set("offline-eval", limit=3)


def all_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


# -- trust_remote_code ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from pipeline.llm.smollm2 import local_smollm2_dir

    tokenizer = AutoTokenizer.from_pretrained(local_smollm2_dir())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, max_position_embeddings=128)
    folder = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("asked", [False, True])
def test_trust_remote_code_reaches_from_pretrained_only_when_the_config_asks(tiny_model_dir, monkeypatch, asked):
    import transformers

    from pipeline.config import load_config
    from pipeline.llm.hf import TransformersLLM
    from pipeline.stages.generate import GenerateConfig

    calls = []
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained

        def recording(*args, _original=original, _name=cls.__name__, **kwargs):
            calls.append((_name, kwargs.get("trust_remote_code", "absent")))
            return _original(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", recording)
    overrides = [f"teacher.model={tiny_model_dir}", "teacher.device=cpu"]
    if asked:
        overrides.append("teacher.trust_remote_code=true")
    cfg = load_config(GenerateConfig, None, overrides)
    TransformersLLM(cfg.teacher)
    assert sorted(calls) == [("AutoModelForCausalLM", asked), ("AutoTokenizer", asked)]


def test_no_source_file_hard_codes_trust_remote_code_true():
    """Every from_pretrained takes the flag from a config (default False), never a literal."""
    sources = Path(__file__).resolve().parents[1].joinpath("pipeline").rglob("*.py")
    hits = [f"{p}:{i}" for p in sources for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"trust_remote_code\s*[=:]\s*True", line)]
    assert hits == []


# -- YAML ----------------------------------------------------------------------------------------

EVIL = '!!python/object/apply:os.system ["touch {marker}"]'


def test_a_python_tag_in_a_config_file_is_refused_not_run(tmp_path):
    marker = tmp_path / "pwned"
    config = tmp_path / "evil.yaml"
    config.write_text(f"generate:\n  limit: {EVIL.format(marker=marker)}\n")
    proc = run_pipeline("generate", "--config", str(config), f"out_dir={tmp_path / 'out'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"error: {config}: not valid YAML (could not determine a constructor")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_python_tag_in_an_override_is_refused_in_one_line(tmp_path):
    marker = tmp_path / "pwned"
    proc = run_pipeline("generate", f"limit={EVIL.format(marker=marker)}", f"out_dir={tmp_path / 'out'}")
    assert not marker.exists() and not (tmp_path / "out").exists()  # never executed, whatever the exit
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


# -- model text ----------------------------------------------------------------------------------

HOSTILE_ACTIONS = ["Search[../../etc/passwd]", "Lookup[$(touch {marker})]", "Search[/etc/passwd]",
                   "Search[__import__('os').system('touch {marker}')]", "Lookup[`touch {marker}`]",
                   "Search[{cwd}]", "Finish[$(rm -rf /) ; touch {marker}]"]


class HostileModel(ScriptedTeacher):
    """Answers ReAct step i with HOSTILE_ACTIONS[i-1] for every question."""

    def __init__(self, questions, marker: Path, cwd: Path):
        super().__init__(questions)
        self.actions = [a.format(marker=marker, cwd=cwd) for a in HOSTILE_ACTIONS]

    def get(self, prompt, default=None):
        self.prompts.append(prompt)
        step = int(re.search(r"Thought (\d+):$", prompt).group(1))
        return [f" Let me try this.\nAction {step}: {self.actions[step - 1]}"]


def test_model_text_only_ever_becomes_observations(tmp_path, index, questions):
    marker, cwd = tmp_path / "pwned", tmp_path / "cwd"
    cwd.mkdir()
    qfile = write_questions(tmp_path / "q.jsonl", questions)
    out = tmp_path / "out"
    with FakeOpenAI(model="hostile") as server:
        server.replies = HostileModel(questions, marker, cwd)
        before = all_files(tmp_path)
        proc = run_pipeline("generate", "teacher.backend=openai", "teacher.model=hostile",
                            f"teacher.base_url={server.url}/v1", f"questions={qfile}", f"wiki.index={index}",
                            f"out_dir={out}", "methods=[react]", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists() and list(cwd.iterdir()) == []
    assert all_files(tmp_path) - before == {out / "react.jsonl", out / "manifest.json", out / ".lock"}
    for r in read_records(out / "react.jsonl"):
        observations = [s["observation"] for s in r["steps"]]
        assert [s["action"] for s in r["steps"]] == server.replies.actions
        assert observations[0].startswith("Could not find ../../etc/passwd. Similar: [")
        assert "root:" not in json.dumps(r)  # /etc/passwd was never read
        assert observations[1] == "No more results." or observations[1].startswith("(Result")
        # The last action ends the episode with its text as a plain answer string, scored as such.
        assert r["prediction"] == f"$(rm -rf /) ; touch {marker}" and r["em"] == 0.0
        assert r["end_reason"] == "finish" and observations[-1] == "Episode finished, reward = 0"


# -- API keys ------------------------------------------------------------------------------------


def test_a_planted_api_key_never_reaches_any_output(tmp_path, index, questions):
    """generate + eval against a server that requires the key; then a server that refuses it and
    echoes it back. Every file under the run folder, stdout and stderr are searched."""
    qfile = write_questions(tmp_path / "q.jsonl", questions)
    env = {"OPENAI_API_KEY": PLANTED, "MY_TEACHER_KEY": PLANTED}
    outputs = []
    with FakeOpenAI(model="keyed", api_key=PLANTED) as server:
        server.replies = ScriptedTeacher(questions)
        common = ("model=keyed", f"base_url={server.url}/v1")
        outputs.append(run_pipeline("generate", *(f"teacher.{c}" for c in common), "teacher.backend=openai",
                                    f"questions={qfile}", f"wiki.index={index}",
                                    f"out_dir={tmp_path / 'run' / 'gen'}", env=env))
        outputs.append(run_pipeline("eval", *(f"model.{c}" for c in common), "model.backend=openai",
                                    "model.api_key_env=MY_TEACHER_KEY", "size_class=8b", "params_b=8",
                                    f"questions={qfile}", f"wiki.index={index}",
                                    f"out_dir={tmp_path / 'run' / 'eval'}", env=env))
        used = {r.headers.get("Authorization") for r in server.requests}
    assert [p.returncode for p in outputs] == [0, 0], [p.stderr for p in outputs]
    assert used == {f"Bearer {PLANTED}"}  # the key was really sent, on every request
    with FakeOpenAI(model="keyed", api_key="sk-another") as refusing:  # echoes the refused key
        refusing.replies = ScriptedTeacher(questions)
        outputs.append(run_pipeline("generate", "teacher.backend=openai", "teacher.model=keyed",
                                    f"teacher.base_url={refusing.url}/v1", f"questions={qfile}",
                                    f"wiki.index={index}", f"out_dir={tmp_path / 'run' / 'refused'}", env=env))
    assert outputs[-1].returncode == 2 and "was refused" in outputs[-1].stderr
    files = all_files(tmp_path / "run")
    assert len(files) >= 12  # records, manifests, summary
    for path in files:
        assert PLANTED.encode() not in path.read_bytes(), path
        assert PLANTED[:12] not in path.read_text(errors="replace"), path
    for proc in outputs:
        assert PLANTED not in proc.stdout + proc.stderr


# -- output paths --------------------------------------------------------------------------------


def test_hostile_question_ids_and_names_stay_inside_the_run_folder(tmp_path, index, questions):
    ids = ["../../escaped", "/tmp/absolute-id", "a/../../b\\c\x00d"]
    qfile = write_questions(tmp_path / "q.jsonl", questions, ids=ids)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "runs" / "gen"
    before = all_files(tmp_path)
    proc = run_pipeline("generate", "teacher.backend=oracle", f"questions={qfile}", f"wiki.index={index}",
                        f"out_dir={out}", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    new = all_files(tmp_path) - before
    assert new == {out / n for n in ("standard.jsonl", "cot.jsonl", "act.jsonl", "react.jsonl",
                                     "manifest.json", ".lock")}
    assert [r["id"] for r in read_records(out / "react.jsonl")] == ids  # kept as data, verbatim
    assert not Path("/tmp/absolute-id").exists()
    for name in ("../escaped", "/tmp/evil", "react/../../x"):  # a method name is never a path
        proc = run_pipeline("generate", "teacher.backend=oracle", f"questions={qfile}", f"wiki.index={index}",
                            f"out_dir={tmp_path / 'runs' / 'm'}", f"methods=[{name}]", cwd=cwd)
        assert proc.returncode == 2 and "writes standard, cot, act, react trajectories" in proc.stderr
    assert all_files(tmp_path) - before == new and list(cwd.iterdir()) == []

