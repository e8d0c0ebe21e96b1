"""Security of the generate / eval path: trust_remote_code only on request, YAML loaded safely,
model text never executed nor used as a path, API keys never written anywhere, and every output
file inside the run folder. Real processes, real files, the fake OpenAI server on 127.0.0.1.

    .venv/bin/python -m pytest tests/test_security.py -q
"""

from __future__ import annotations

import ast
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
    from pipeline.tasks.hotpotqa.questions import load_question_set

    return load_question_set("offline-eval", limit=3)


def all_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


# -- trust_remote_code ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, smollm2_dir) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=128, max_position_embeddings=128)
    folder = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def record_trust_remote_code(monkeypatch) -> list[tuple[str, object]]:
    """Wrap the real AutoTokenizer / AutoModelForCausalLM.from_pretrained; each call appends
    (class, the trust_remote_code it was given, or "absent")."""
    import transformers

    calls = []
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained

        def recording(*args, _original=original, _name=cls.__name__, **kwargs):
            calls.append((_name, kwargs.get("trust_remote_code", "absent")))
            return _original(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", recording)
    return calls


@pytest.mark.parametrize("asked", [False, True])
def test_trust_remote_code_reaches_the_inference_loader_only_when_the_config_asks(tiny_model_dir, monkeypatch, asked):
    from pipeline.core.config import load_config
    from pipeline.llm.hf import TransformersLLM
    from pipeline.stages.generate import GenerateConfig

    calls = record_trust_remote_code(monkeypatch)
    overrides = [f"teacher.model={tiny_model_dir}", "teacher.device=cpu"]
    if asked:
        overrides.append("teacher.trust_remote_code=true")
    cfg = load_config(GenerateConfig, None, overrides)
    TransformersLLM(cfg.teacher)
    assert sorted(calls) == [("AutoModelForCausalLM", asked), ("AutoTokenizer", asked)]


@pytest.mark.parametrize("asked", [False, True])
def test_trust_remote_code_reaches_the_training_loader_only_when_the_config_asks(tiny_model_dir, monkeypatch, asked):
    """The same through pipeline/finetune.py's loaders (what `accelerate launch` runs), on a
    pretrained student given as a local folder."""
    from pipeline.core.config import load_config
    from pipeline.train.config import FinetuneConfig, resolve
    from pipeline.train.data import load_tokenizer
    from pipeline.train.model import load_student
    from pipeline.train.plan import plan_training

    calls = record_trust_remote_code(monkeypatch)
    overrides = [f"student={tiny_model_dir}", "finetuning=full", "precision=fp32", "max_steps=1"]
    if asked:
        overrides.append("trust_remote_code=true")
    cfg = resolve(load_config(FinetuneConfig, None, overrides))
    load_student(cfg, load_tokenizer(cfg), plan_training(cfg))
    assert sorted(calls) == [("AutoModelForCausalLM", asked), ("AutoTokenizer", asked)]


TRUST = "trust_remote_code"


def _true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_flag(node) -> bool:
    """`trust_remote_code` as a name, an attribute, a subscript key or a string constant."""
    if isinstance(node, ast.Constant):
        return node.value == TRUST
    if isinstance(node, ast.Name):
        return node.id == TRUST
    if isinstance(node, ast.Attribute):
        return node.attr == TRUST
    if isinstance(node, ast.Subscript):
        return _is_flag(node.slice)
    return False


def trust_remote_code_set_true(source: str) -> list[int]:
    """Lines of Python source that set trust_remote_code to a literal True, in any of the forms
    code uses: a keyword argument, a dict key (the form pipeline/ itself uses for its kwargs),
    a subscript, attribute or annotated assignment (a dataclass default), or positional
    ("trust_remote_code", True) as in setdefault / setattr."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg == TRUST and _true(node.value):
            hits.append(node.value.lineno)
        elif isinstance(node, ast.Dict):
            hits += [v.lineno for k, v in zip(node.keys, node.values, strict=True) if _is_flag(k) and _true(v)]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if _true(node.value) and any(_is_flag(t) for t in targets):
                hits.append(node.lineno)
        elif isinstance(node, ast.Call):
            hits += [b.lineno for a, b in zip(node.args, node.args[1:], strict=False) if _is_flag(a) and _true(b)]
    return hits


@pytest.mark.parametrize("source", [
    "AutoModel.from_pretrained(name, trust_remote_code=True)",
    'kwargs = {"trust_remote_code": True, "dtype": dtype}',
    "kwargs = dict(trust_remote_code=True)",
    'kwargs["trust_remote_code"] = True',
    "cfg.trust_remote_code = True",
    "class C:\n    trust_remote_code: bool = True",
    'kwargs.setdefault("trust_remote_code", True)',
    'setattr(cfg, "trust_remote_code", True)',
])
def test_the_scan_catches_every_form_of_a_hard_coded_true(source):
    assert trust_remote_code_set_true(source) != []


@pytest.mark.parametrize("source", [
    'kwargs: dict = {"trust_remote_code": cfg.trust_remote_code}',  # pipeline/finetune.py's form
    "AutoTokenizer.from_pretrained(name, trust_remote_code=cfg.trust_remote_code)",
    "trust_remote_code: bool = False",
])
def test_the_scan_passes_a_flag_taken_from_the_config(source):
    assert trust_remote_code_set_true(source) == []


def test_no_source_file_or_config_hard_codes_trust_remote_code_true():
    """Every from_pretrained takes the flag from a config (default False), never a literal True;
    no shipped YAML config turns it on."""
    repo = Path(__file__).resolve().parents[1]
    sources = sorted(repo.joinpath("pipeline").rglob("*.py"))
    assert len(sources) > 20  # the scan really read the package
    hits = [f"{p}:{line}" for p in sources for line in trust_remote_code_set_true(p.read_text(encoding="utf-8"))]
    assert hits == []
    uses = sum(p.read_text(encoding="utf-8").count(TRUST) for p in sources)
    assert uses >= 5  # the loaders that pass it on (hf.py, finetune.py, vllm_backend.py) were seen
    configs = sorted(repo.joinpath("configs").rglob("*.yaml"))
    assert configs and not [str(p) for p in configs if re.search(rf"^\s*(\w+\.)?{TRUST}\s*:\s*(true|yes|on)\b",
                                                                  p.read_text(encoding="utf-8"), re.M | re.I)]


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
    records = read_records(out / "react.jsonl")
    assert len(records) == len(questions)
    for r in records:
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
    # every file both runs wrote (the refused run wrote nothing): records, manifests, summary, locks
    expected = {f"{stage}/{m}.jsonl" for stage in ("gen", "eval") for m in ("standard", "cot", "act", "react")}
    expected |= {"gen/manifest.json", "gen/.lock", "eval/manifest.json", "eval/summary.json", "eval/.lock"}
    assert {str(f.relative_to(tmp_path / "run")) for f in files} == expected
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
    proc = run_pipeline("generate", "oracle=exact", f"questions={qfile}", f"wiki.index={index}",
                        f"out_dir={out}", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    new = all_files(tmp_path) - before
    assert new == {out / n for n in ("standard.jsonl", "cot.jsonl", "act.jsonl", "react.jsonl",
                                     "manifest.json", ".lock")}
    assert [r["id"] for r in read_records(out / "react.jsonl")] == ids  # kept as data, verbatim
    assert not Path("/tmp/absolute-id").exists()
    for name in ("../escaped", "/tmp/evil", "react/../../x"):  # stopped by the methods' allow-list
        proc = run_pipeline("generate", "oracle=exact", f"questions={qfile}", f"wiki.index={index}",
                            f"out_dir={tmp_path / 'runs' / 'm'}", f"methods=[{name}]", cwd=cwd)
        assert proc.returncode == 2 and "writes standard, cot, act, react trajectories" in proc.stderr
    assert all_files(tmp_path) - before == new and list(cwd.iterdir()) == []


HOSTILE_NAMES = ["../escaped", "/tmp/evil", "react/../../x", "..", ".", "", ".hidden", "a\\b", "x\x00y",
                 "react/", "react.jsonl/../../x", "~/x", " react"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_the_method_file_name_check_refuses_paths(tmp_path, name):
    from pipeline.agent.episodes import method_file
    from pipeline.core.errors import PipelineError

    with pytest.raises(PipelineError, match="cannot name a file in"):
        method_file(tmp_path, name)


@pytest.mark.parametrize("name", ["react", "cot_sc", "react_to_cot_sc", "my-method2"])
def test_the_method_file_name_check_keeps_plain_names_in_out_dir(tmp_path, name):
    from pipeline.agent.episodes import method_file

    assert method_file(tmp_path, name) == tmp_path / f"{name}.jsonl"


def test_with_the_allow_list_bypassed_hostile_method_names_still_write_nothing(tmp_path, questions, monkeypatch):
    """The episode runner that generate and eval share, with the allow-list replaced by a
    stand-in that accepts any name (building the real ReAct method): the path is now built from
    the hostile name, and the file-name check refuses it before anything is opened."""
    from pipeline.agent import episodes
    from pipeline.core.errors import PipelineError
    from pipeline.methods import build_method

    class AnyName:  # a stand-in answerer that accepts every method name (no allow-list)
        label = "stand-in"

        def method(self, name, settings):
            return build_method("react", settings)

    out, cwd = tmp_path / "runs" / "gen", tmp_path / "cwd"
    out.mkdir(parents=True)
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = all_files(tmp_path)
    for name in HOSTILE_NAMES:
        with pytest.raises(PipelineError, match="cannot name a file in"):
            episodes.run_methods(AnyName(), None, [name], questions, None, None, out,
                                 max_in_flight=1, source="test")
    assert all_files(tmp_path) == before and list(cwd.iterdir()) == [] and not Path("/tmp/evil.jsonl").exists()

