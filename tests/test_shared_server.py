"""One managed server for several eval units of a `run` (pipeline/llm/serve_groups.py): the prompted
methods of SmolLM2 and two LoRA students of it, served by ONE server with the adapters by name,
each unit keeping its own folder, records and resume. Against tests/standin_vllm_serve.py (a
labelled stand-in, for what a real server cannot be made to do: die on cue) and against a real
vLLM (one start-up for the three units; skipped without .venv-vllm).

    .venv/bin/python -m pytest tests/test_shared_server.py -q
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from episode_testdata import CORPUS, read_records, run_pipeline, write_questions
from vllm_testdata import (
    MODEL_SETTINGS,
    SERVER_ENV,
    TAG_VAR,
    grid_config,
    mark_trained,
    new_tag,
    wait_until_gone,
)

pytestmark = pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")

STANDIN = Path(__file__).resolve().parent / "standin_vllm_serve.py"
UNITS = ("tiny-prompt", "tiny-ft-act", "tiny-ft-react")


@pytest.fixture
def questions(tmp_path):
    from pipeline.tasks.hotpotqa.questions import load_question_set

    return write_questions(tmp_path / "q.jsonl", load_question_set("offline-eval", limit=2))


def standin_serve(tmp_path: Path, questions: Path, tag: str, *extra: str) -> dict:
    return {"command": [sys.executable, str(STANDIN)], "port": 0, "startup_timeout_s": 60, "stop_grace_s": 5,
            "env": {TAG_VAR: tag},
            "extra_args": ["--standin-questions", str(questions), "--standin-record", str(tmp_path / "server.jsonl"),
                           *extra]}


def server_events(tmp_path: Path) -> list[dict]:
    path = tmp_path / "server.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_plan_shows_which_units_share_which_server(tmp_path, index, questions, smollm2_dir):
    config = grid_config(tmp_path, index, questions, {"backend": "vllm"}, standin_serve(tmp_path, questions, "x"))
    proc = run_pipeline("run", "--config", str(config), "--print-config")
    assert proc.returncode == 0, proc.stderr[-2000:]
    short_plan = proc.stdout.split("units' configs follow")[0]  # the plan comes first, then each unit's config
    lines = [line for line in short_plan.splitlines() if "shared server #1" in line]
    assert len(lines) == 3 and "(units 5, 6, 7; 2 LoRA adapter(s) by name)" in lines[0], proc.stdout[:3000]


def test_a_grid_acting_through_tool_calls_starts_its_shared_server_with_the_tool_call_flags(
        tmp_path, index, questions, smollm2_dir):
    """`eval.prompting.interface: tools` and students trained with `train: {layout: messages}`:
    the three units share one server, started (the stand-in records its argv) with vLLM's hermes
    parser and SmolLM2's shipped chat template, as a unit's own server would be. A student left
    in the text layout is refused when the plan is made, not after its training."""
    import yaml

    from pipeline.core.config import build, load_config
    from pipeline.core.errors import PipelineError
    from pipeline.hub.chat_template import TOOL_CALLS_TEMPLATE
    from pipeline.stages.grid.plan import plan
    from pipeline.stages.grid.spec import RunConfig, Student

    tag = new_tag()
    config = grid_config(tmp_path, index, questions, {"backend": "vllm"}, standin_serve(tmp_path, questions, tag))
    grid = yaml.safe_load(config.read_text())
    grid["eval"]["prompting"]["interface"] = "tools"

    def planned(layout: str) -> list:
        grid["students"][0]["train"] = {"layout": layout}
        config.write_text(yaml.safe_dump(grid))
        cfg = load_config(RunConfig, config, [])
        return plan(cfg, [build(Student, s) for s in cfg.students])

    with pytest.raises(PipelineError, match=r"tiny-ft-act\): .* was trained on the text layout; prompting.interface=tools"):
        planned("text")
    units = planned("messages")
    evals = [u for u in units if u.phase == "eval"]
    assert [u.config.prompting.interface for u in evals] == ["tools"] * 3 and len({id(u.group) for u in evals}) == 1
    assert "tool calls: --tool-call-parser hermes --chat-template smollm2-tool-calls" in evals[0].needs
    mark_trained(config)
    group = evals[0].group
    try:
        group.start()
    finally:
        group.stop(hurry=True)
    [argv] = [e["argv"] for e in server_events(tmp_path) if "argv" in e]
    assert " --enable-auto-tool-choice --tool-call-parser hermes --chat-template " in " ".join(argv) + " "
    assert argv[argv.index("--chat-template") + 1] == str(TOOL_CALLS_TEMPLATE)
    assert wait_until_gone(tag, 10) == []


def test_one_server_serves_the_grid_a_killed_one_stops_it_in_one_line_and_the_next_run_resumes(
        tmp_path, index, questions, smollm2_dir):
    """The stand-in dies at its 11th completion request (the prompted unit asks 8 times, the second
    unit's first episode 2): the run stops with one line and no server process left; the next run
    starts ONE server again, skips the finished unit, resumes the second and runs the third."""
    tag = new_tag()
    cue = tmp_path / "die-after"
    cue.write_text("10")
    config = grid_config(tmp_path, index, questions, {"backend": "vllm"},
                         standin_serve(tmp_path, questions, tag, "--standin-die-file", str(cue)), max_in_flight=1)
    mark_trained(config)
    proc = run_pipeline("run", "--config", str(config), "--only", "eval", timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "server is gone mid-run" in errors[0] and "re-run" in errors[0], proc.stderr[-3000:]
    assert wait_until_gone(tag, 10) == []
    run = tmp_path / "run" / "eval"
    assert json.loads((run / "tiny-prompt" / "manifest.json").read_text())["complete"]
    partial = read_records(run / "tiny-ft-act" / "act.jsonl")
    assert len(partial) == 1 and not (run / "tiny-ft-act" / "summary.json").exists()

    cue.unlink()
    proc = run_pipeline("run", "--config", str(config), "--only", "eval", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("[serve] starting:") == 1, proc.stdout
    assert "[run] skip:" in proc.stdout  # the prompted unit, complete before the server died
    assert read_records(run / "tiny-ft-act" / "act.jsonl")[:len(partial)] == partial
    for unit in UNITS:
        assert json.loads((run / unit / "manifest.json").read_text())["complete"], unit
    starts = [e["argv"] for e in server_events(tmp_path) if "argv" in e]
    assert len(starts) == 2  # one per run, never one per unit
    modules = starts[-1][starts[-1].index("--lora-modules") + 1:]
    assert {m.split("=")[0] for m in modules[:2]} == {"tiny-ft-act", "tiny-ft-react"}
    assert starts[-1][starts[-1].index("--max-num-seqs") + 1] == "1"  # its units' max_in_flight
    asked = {e["model"] for e in server_events(tmp_path) if "model" in e}
    assert asked == {"SmolLM2", "tiny-ft-act", "tiny-ft-react"}  # each unit by its own name
    assert wait_until_gone(tag, 10) == []


@pytest.mark.slow
@pytest.mark.vllm
def test_one_real_vllm_start_up_serves_a_prompted_model_and_two_lora_students(tmp_path, index, questions,
                                                                              smollm2_dir, lora_adapter):
    tag = new_tag()
    serve = {"port": 0, "startup_timeout_s": 900, "stop_grace_s": 20, "env": {**SERVER_ENV, TAG_VAR: tag}}
    config = grid_config(tmp_path, index, questions, {"backend": "vllm", **MODEL_SETTINGS}, serve)
    mark_trained(config, lora_adapter)  # copied into each student's final/
    proc = run_pipeline("run", "--config", str(config), "--only", "eval", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("[serve] starting:") == 1 and proc.stdout.count("[serve] healthy") == 1, proc.stdout
    assert proc.stdout.count("[serve] using the shared server") == 3
    run = tmp_path / "run" / "eval"
    for unit in UNITS:
        manifest = json.loads((run / unit / "manifest.json").read_text())
        assert manifest["complete"] and manifest["precision"] == "fp32", unit
    log = (run / "shared-server-1.log").read_text(errors="replace")
    assert "tiny-ft-act" in log and "tiny-ft-react" in log
    assert wait_until_gone(tag, 10) == []


def test_a_student_missing_from_the_started_server_is_named_with_its_adapter(tmp_path):
    """A LoRA student whose adapter was not there when its group's server started ran unattached,
    and its GPU check then named the group's own server. It now stops in one line naming its
    adapter: missing (its training has not finished), or there since the server started."""
    from types import SimpleNamespace

    from pipeline.core.errors import PipelineError
    from pipeline.llm.serve_groups import ServerGroup
    from pipeline.llm.serving import SharedServer

    ran = []
    here, late = tmp_path / "ft-react" / "final", tmp_path / "ft-act" / "final"
    here.mkdir(parents=True)
    (here / "adapter_config.json").write_text("{}")
    units = [SimpleNamespace(serves=(str(tmp_path / "base"), str(folder)), action=ran.append, selected=True,
                             config=SimpleNamespace(out_dir=tmp_path / "eval" / name))
             for folder, name in ((here, "tiny-ft-react"), (late, "tiny-ft-act"))]
    group = ServerGroup(1, units, done=lambda unit: False)
    group.server = object()  # started: with the one adapter that was there
    group.shared = SharedServer("127.0.0.1", 1, str(tmp_path / "base"), "base", {"tiny-ft-react": str(here)}, 0, "")
    group.wrap(units[0])("config of react")
    assert ran == ["config of react"]
    with pytest.raises(PipelineError) as info:
        group.wrap(units[1])("config of act")
    assert str(info.value) == (f"tiny-ft-act: its LoRA adapter {late / 'adapter_config.json'} is not there (its "
                               f"training has not finished), so shared server #1 for {tmp_path / 'base'} started with "
                               "1 adapter(s) (tiny-ft-react) without it; train it first (its train unit), then run again")
    late.mkdir(parents=True)
    (late / "adapter_config.json").write_text("{}")
    with pytest.raises(PipelineError, match=f"tiny-ft-act: its LoRA adapter {late} was not there when shared server "
                                            "#1 .* started with 1 adapter"):
        group.wrap(units[1])("config of act")
    assert ran == ["config of react"]  # neither ran unattached
