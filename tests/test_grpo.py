"""GRPO in the environment (`python -m pipeline grpo`, pipeline/rl/): real parts throughout.

    .venv/bin/python -m pytest tests/test_grpo.py -m "not slow"   # traces, refusals, the per-token mask (~20 s)
    .venv/bin/python -m pytest tests/test_grpo.py                 # + learning, kill/resume, DDP, ZeRO, SmolLM2

The world (tests/rl_testdata.py): a real SQLite index of 16 synthetic pages, a BPE tokenizer
trained here, a tiny Llama (random, or warm-started by SFT so it knows the ReAct format but
copies the observed answer only 30% of the time). The slow tests train it with TRL's GRPOTrainer
through the project's own ReAct loop: in process (learning), and under real `accelerate launch`
processes (one process killed with SIGKILL and resumed, 2-process DDP, DeepSpeed ZeRO-3), each
compared step by step with one uninterrupted run; and SmolLM2-135M with LoRA on real offline
questions. Precision is pinned to fp32 (ZeRO on CPU trains fp32) so runs compare exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rl_testdata import COLOURS, build_world, train_tokenizer, warm_start, warm_start_examples
from test_finetune import (  # a launch's log and exit code; SIGKILL of its whole tree
    finish,
    kill_tree,
)

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.llm.base import cut_at_stop
from pipeline.rl.config import GrpoConfig, resolve
from pipeline.rl.policy import TokenCompletion
from pipeline.rl.trace import TokenTrace
from pipeline.train.notices import EXPERIMENTAL_TRL_LINE

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
LEARNING_MARGIN = 0.25  # mean reward of the last 5 steps minus the first 5's, at least (measured: +0.45)
LOSS_TOLERANCE = 1e-4  # the same rollouts (seeded sampling) give the same losses up to float reduction order
LAUNCH_TIMEOUT = 600  # seconds for one launch of a few tiny steps (~20 s on an idle machine; a shared one is slower)


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("rl-world"))


@pytest.fixture(scope="module")
def random_student(world, tmp_path_factory) -> Path:
    """A tiny Llama with the world's tokenizer, untrained: it writes noise (the fast tests)."""
    import torch
    from rl_testdata import DIMS
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("rl-random")
    texts = [p + c for p, c in warm_start_examples(world, 0.3, 64)]
    tokenizer = train_tokenizer(texts)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **DIMS))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@contextlib.contextmanager
def one_thread():
    """Tiny models run fastest on one thread (their ops are too small to split), and the
    launched runs get OMP_NUM_THREADS=1 too; the in-process ones set it for their duration."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def warm_student(world, tmp_path_factory) -> Path:
    """The warm-started policy (~20 s of SFT on one core)."""
    with one_thread():
        return warm_start(world, tmp_path_factory.mktemp("rl-warm"), copy_rate=0.3, steps=500)


def world_args(world, student: Path, out: Path, *overrides: str) -> list[str]:
    """The key=value settings of a GRPO run in the world (for a config here or a command line)."""
    return [f"student={student}", f"questions={world.questions}", f"wiki.index={world.index}",
            f"wiki.corpus=[{world.corpus}]", f"output_root={out}", "precision=fp32", "prompting.max_steps=4",
            "prompting.max_new_tokens=24", "rollout.max_batch_size=64", "learning_rate=1e-3", "report_to=none",
            *overrides]


def world_cfg(world, student: Path, out: Path, *overrides: str) -> GrpoConfig:
    return resolve(load_config(GrpoConfig, None, world_args(world, student, out, *overrides)))


def log_history(output_dir: Path) -> list[dict]:
    """The per-step log of a finished run (the last checkpoint's trainer_state.json)."""
    from pipeline.train.checkpoints import list_checkpoints

    state = json.loads((list_checkpoints(output_dir)[-1] / "trainer_state.json").read_text(encoding="utf-8"))
    return [e for e in state["log_history"] if "loss" in e and "reward" in e]


# ----------------------------------------------------------------------------- the token trace

def test_trace_rebuilds_the_renderers_text_and_masks_the_loop(world):
    """Policy tokens are kept exactly as sampled; the loop's text is appended masked; a policy
    line the renderer does not keep (a second line after the action) is dropped, counted."""
    from pipeline.core.trajectory import Step, Trajectory, render

    tokenizer = train_tokenizer([p + c for p, c in warm_start_examples(world, 0.3, 64)])
    prompt = "Question: What colour is alpha?\n"
    trace = TokenTrace(tokenizer, prompt)
    context = trace.context(prompt + "Thought 1:")
    assert context[:len(trace.prompt_ids)] == tokenizer(prompt)["input_ids"] and trace.mask == [0] * len(trace.ids)
    sampled = tokenizer(" I search alpha.\nAction 1: Search[alpha]\nblue\nObservation 1:")["input_ids"]
    trace.add_policy(sampled)
    assert trace.ids[-len(sampled):] == sampled and trace.mask[-len(sampled):] == [1] * len(sampled)
    traj = Trajectory("What colour is alpha?", "react",
                      [Step("I search alpha.", "Search[alpha]", "The colour of alpha is gold.")])
    trace.context(render(traj).text + "Thought 2:")
    expected = render(traj).completion + "Thought 2:"
    assert trace.text == expected
    kept = tokenizer(" I search alpha.\nAction 1: Search[alpha]\n")["input_ids"]
    assert trace.dropped_policy_tokens == len(sampled) - len(kept) > 0
    assert sum(trace.mask) == len(kept)  # only the kept policy tokens are in the loss
    policy_text = tokenizer.decode([t for t, m in zip(trace.ids, trace.mask, strict=True) if m])
    assert policy_text == " I search alpha.\nAction 1: Search[alpha]\n"
    trace.finish(render(traj).completion, tokenizer.eos_token_id)
    assert trace.ids[-1] == tokenizer.eos_token_id and trace.mask[-1] == 0
    assert trace.text.removesuffix(tokenizer.eos_token) == render(traj).completion


def test_trace_refuses_a_tokenizer_that_loses_text(world):
    tokenizer = train_tokenizer(["Question: What colour is alpha?\nThought 1:"])
    trace = TokenTrace(tokenizer, "Question: What colour is alpha?\n")
    with pytest.raises(PipelineError, match="does not give back the loop's text"):
        trace.context("Question: What colour is alpha?\nThought 1: \u00e9t\u00e9")  # not in its alphabet


# ----------------------------------------------------------------------------- config and start refusals

def test_config_refusals_are_one_line(world, random_student, tmp_path, capsys):
    from pipeline.cli import main

    base = [f"student={random_student}", f"questions={world.questions}", f"output_root={tmp_path}"]
    cases = [
        (["format=cot"], "GRPO runs the interactive loops react, act"),
        (["prompting.temperature=0"], "prompting.temperature: GRPO samples"),
        (["group_size=1"], "'group_size' must be >= 2, got 1 (GRPO compares the rollouts of one question)"),
        (["prompting.style=prompt"], "GRPO trains zero-shot"),
        (["prompting.interface=tools"], "prompting.interface: GRPO's rollouts decode the text layout"),
        (["reward.em=0"], "not all 0"),
        (["rollout.engine=vllm", "rollout.vllm_mode=server"], "needs the `trl vllm-serve` URL"),
        (["questions_per_step=17"], "fewer than questions_per_step=17"),
        (["grop_size=4"], "did you mean 'group_size'"),
        (["group_size=3", "questions_per_step=3", "accelerate_config=cpu_ddp", "--dry-run"],
         "9 rollouts per step (questions_per_step x group_size) do not divide over 2 processes"),
        (["student=forestai/fireact_llama_2_7b_lora"], "decodes in the 'fireact' format"),
        (["base_model=/somewhere"], "is not one; drop it"),
        ([f"student={tmp_path}/no-such-student/react/final"], "no-such-student/react/final not found"),
        (["rollout.engine=vllm"], "rollout.max_context: colocated vLLM needs the episode's token budget"),
        (["rollout.engine=vllm", "rollout.max_context=4096", "rollout.vllm_tensor_parallel_size=2"],
         "which tensor parallelism cannot take"),
        (["accelerate_config=fsdp", "--num-processes", "1", "--dry-run"],
         "rollout.engine=transformers cannot run under FSDP"),
        (["wiki.search=bm3"], "'wiki.search' must be title or bm25, got 'bm3'"),
        (["wiki.search=bm25", "wiki.backend=live", "--dry-run"], "wiki.search=bm25 ranks the pages of a local index"),
        (["task=fever", "wiki.search=bm25", "--dry-run"], "wiki.search=bm25 does not apply to FEVER"),
    ]
    for extra, needle in cases:
        assert main(["grpo", *base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (extra, err)


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "grpo").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_grpo_configs_resolve(path):
    """Every shipped GRPO config reads and resolves (keys, types, the refusals of resolve()):
    the 8B colocated one has its vLLM context, the round-3 one its held-out curve."""
    cfg = resolve(load_config(GrpoConfig, path, []))
    assert cfg.output_dir is not None
    if cfg.rollout.engine == "vllm":
        assert cfg.rollout.max_context == 4096
    if path.stem.endswith("round3"):
        assert (cfg.heldout.every, cfg.loss_type, cfg.reward.f1) == (20, "dr_grpo", 0.5)


@pytest.mark.slow
def test_vllm_rollouts_without_vllm_are_refused_before_the_launch(world, random_student, tmp_path):
    """`grpo` with rollout.engine=vllm where no interpreter has vLLM (this suite's .venv, and no
    vLLM in .venv-vllm): one line naming both, exit 2, before anything is written or
    launched. Before the check the launch went ahead, the child loaded the policy and died in
    TRL's ImportError (GRPOTrainer: "vLLM is not available and `use_vllm` is set to True")."""
    import importlib.util

    from pipeline.llm.interpreter import PYTHON_ENV

    assert importlib.util.find_spec("vllm") is None, "this suite's venv has vLLM: the check cannot be shown here"
    cmd = [PYTHON, "-m", "pipeline", "grpo", *world_args(world, random_student, tmp_path, "accelerate_config=cpu",
                                                         "rollout.engine=vllm", "rollout.max_context=512",
                                                         "max_steps=1")]
    nowhere = tmp_path / "no-vllm-env" / "bin" / "python"  # the vLLM environment, as if not made
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT,
                         env={**os.environ, "PYTHONPATH": str(REPO), PYTHON_ENV: str(nowhere)})
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
    assert out.stderr.count("\n") == 1 and f"no vLLM environment at {nowhere}" in out.stderr, out.stderr
    assert f"vLLM is not installed for {PYTHON}" in out.stderr
    assert "accelerate" not in out.stdout and not list(tmp_path.rglob("grpo_config.yaml"))  # nothing launched, nothing written


def test_dry_run_prints_the_launch(world, random_student, tmp_path, capsys):
    from pipeline.cli import main

    assert main(["grpo", f"student={random_student}", f"questions={world.questions}", f"output_root={tmp_path}",
                 "accelerate_config=cpu_ddp", "questions_per_step=4", "group_size=4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 questions x 4 rollouts = 8 x 1 accumulation x 2 processes" in out
    assert "accelerate_configs/cpu_ddp.yaml --num_processes 2" in out
    assert re.search(r"-m pipeline\.rl\.train --config \S+/grpo_config\.yaml", out)
    assert not list(tmp_path.rglob("grpo_config.yaml"))  # a dry run writes nothing


def test_start_points(world, random_student, tmp_path):
    """A final/ of ours (full, LoRA), a PEFT adapter folder, a base model; a student of another
    format is refused with the fix."""
    import shutil

    from pipeline.core.storage import write_manifest
    from pipeline.rl.start import resolve_start

    final = tmp_path / "sft" / "final"
    shutil.copytree(random_student, final)
    write_manifest(final / "manifest.json", stage="train", config={}, complete=True, student="tiny-sft",
                   format="react", adapter=False, size_class="tiny")
    start = resolve_start(str(final), fmt="react")
    assert (start.kind, start.model, start.adapter, start.label, start.size_class) == \
           ("ours", str(final), None, "tiny-sft", "tiny")
    assert resolve(load_config(GrpoConfig, None, [f"student={final}"])).student_name == "tiny-sft-grpo"
    with pytest.raises(PipelineError, match="trained on 'react' trajectories; GRPO in the 'act' loop"):
        resolve_start(str(final), fmt="act")
    write_manifest(final / "manifest.json", stage="train", config={}, complete=True, student="tiny-sft",
                   format="react", adapter=False, size_class="tiny", layout="messages")
    with pytest.raises(PipelineError, match="trained in the messages layout .* start from a student trained in the text"):
        resolve_start(str(final), fmt="react")  # outside a grid too (a grid refuses it at plan time)
    lora = tmp_path / "lora" / "final"
    lora.mkdir(parents=True)
    write_manifest(lora / "manifest.json", stage="train", config={}, complete=True, student="tiny-lora",
                   format="react", adapter=True, base_model=str(random_student))
    start = resolve_start(str(lora), fmt="react")
    assert (start.model, start.adapter, start.origin) == (str(random_student), str(lora), str(random_student))
    write_manifest(lora / "manifest.json", stage="train", config={}, complete=True, student="tiny-lora",
                   format="react", adapter=True, base_model=str(tmp_path / "gone"))
    with pytest.raises(PipelineError, match="base model .* is missing"):
        resolve_start(str(lora), fmt="react")
    assert resolve_start(str(random_student), fmt="react").kind == "base"


def test_eval_reads_a_grpo_final_as_a_student_whose_rows_say_grpo(random_student, tmp_path):
    """A `grpo` final/ (its manifest as pipeline.rl.train writes it) is a fine-tuned student to
    `eval`: zero-shot in its format, sized from its manifest, labelled GRPO, and its summary rows
    carry `training: grpo` (what plot draws with its own marker); a `train` final/'s rows do not."""
    import shutil

    from pipeline.core.storage import write_manifest
    from pipeline.stages.eval import EvalConfig, model_under_test, summary_row

    rows = {}
    for stage in ("grpo", "train"):
        final = tmp_path / stage / "final"
        shutil.copytree(random_student, final)
        write_manifest(final / "manifest.json", stage=stage, config={}, complete=True, student=f"tiny-{stage}",
                       format="react", adapter=False, size_class="tiny", params_b=0.0001, precision="fp32")
        target = model_under_test(EvalConfig(finetuned=final))
        assert (target.mode, target.decode_style, target.trained_format, target.llm.model) == \
            ("finetune", "zero_shot", "react", str(final))
        rows[stage] = summary_row(target, "react", "offline-eval", {"em": 0.5, "n": 2}, {"precision": "fp32"})
    assert rows["grpo"]["model"] == "tiny-grpo (GRPO)" and rows["grpo"]["training"] == "grpo"
    assert rows["train"]["model"] == "tiny-train (fine-tuned)" and "training" not in rows["train"]


def test_grpo_report_compares_em_with_intervals(tmp_path, capsys):
    """scripts/grpo_report.py: EM before / after on the questions both evaluated, Wilson and Newcombe,
    the paired counts and McNemar's p."""
    sys.path.insert(0, str(REPO / "scripts"))
    import grpo_report

    from pipeline.report.intervals import difference_interval

    for name, right in (("before", 1), ("after", 4)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "react.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "em": float(i < right)}) + "\n"
                                                    for i in range(10 if name == "before" else 12)))
    assert grpo_report.main([str(tmp_path / "before"), str(tmp_path / "after")]) == 0
    out = capsys.readouterr().out
    low, high = difference_interval(4, 10, 1, 10)
    assert "n=10" in out and "| 10.0 [" in out and "| 40.0 [" in out
    assert f"+30.0 [{100 * low:.1f}, {100 * high:.1f}]" in out
    assert "Paired: 1 right in both, 0 only before, 3 only after; McNemar's exact p = 0.25" in out


def test_grpo_report_pairs_only_the_shared_questions_both_ways(tmp_path, capsys):
    """scripts/grpo_report.py's paired counts: questions going right -> wrong as well as wrong ->
    right, and questions evaluated in one folder only (all right there) that no count may include:
    shared 2 right in both, 3 only before, 1 only after; over all questions it would be 2, 5, 4."""
    sys.path.insert(0, str(REPO / "scripts"))
    import grpo_report

    from pipeline.report.intervals import mcnemar_exact

    shared = {"q0": (1, 1), "q1": (1, 1), "q2": (1, 0), "q3": (1, 0), "q4": (1, 0), "q5": (0, 1),
              "q6": (0, 0), "q7": (0, 0), "q8": (0, 0), "q9": (0, 0)}
    records = {"before": {**{q: em[0] for q, em in shared.items()}, "x0": 1, "x1": 1},
               "after": {**{q: em[1] for q, em in shared.items()}, "y0": 1, "y1": 1, "y2": 1}}
    for name, ems in records.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "react.jsonl").write_text("".join(json.dumps({"id": q, "em": float(em)}) + "\n"
                                                             for q, em in ems.items()))
    assert grpo_report.main([str(tmp_path / "before"), str(tmp_path / "after")]) == 0
    out = capsys.readouterr().out
    assert "n=10" in out and "| 50.0 [" in out and "| 30.0 [" in out and "| -20.0 [" in out
    assert (f"Paired: 2 right in both, 3 only before, 1 only after; McNemar's exact p = {mcnemar_exact(3, 1):.3g}"
            in out)
    assert mcnemar_exact(3, 1) == pytest.approx(0.625)  # two-sided exact binomial: 2 * (1 + 4) / 2**4


# ----------------------------------------------------------------------------- the loss mask, per token

class ScriptedPolicy:
    """STAND-IN for the policy's sampler (labelled as such): it writes a fixed ReAct step for
    each request, answering right and wrong in turn, so the group's advantages are not zero.
    Everything around it is real: the episode program, the WikiEnv over the SQLite index, the
    token trace, TRL's scoring and loss on the real tiny model."""

    stray = ""  # a line written after the search action, which the renderer does not keep

    def __init__(self, tokenizer, colour: dict[str, str], model=None, temperature: float = 1.0):
        self.tokenizer, self.colour, self.answers = tokenizer, colour, 0
        self.model, self.temperature = model, temperature

    def generate(self, requests):
        out = []
        for req in requests:
            text = self.tokenizer.decode(req.prompt_ids)
            name = re.search(r"What colour is (\w+)\?", text).group(1)
            if text.endswith("Thought 1:"):
                step = f" I search {name}.\nAction 1: Search[{name}]{self.stray}\nObservation 1:"
            else:
                self.answers += 1
                right = self.colour[name]
                said = right if self.answers % 2 else next(c for c in COLOURS if c != right)
                step = f" It is {said}.\nAction 2: Finish[{said}]\nObservation 2:"
            ids = self.tokenizer(step, add_special_tokens=False)["input_ids"]
            out.append([TokenCompletion(cut_at_stop(step, req.stop)[0], len(req.prompt_ids), len(ids), "stop",
                                        token_ids=ids)])
        return out


def scripted_trainer(world, student: Path, tmp_path: Path, policy_class, *overrides: str):
    """The real GRPO trainer of a one-step run (2 questions x 4 rollouts), its rollouts sampled
    by a stand-in policy, ready for one step's inputs (`trainer._prepare_inputs`)."""
    from pipeline.rl import train as rl_train
    from pipeline.rl.plan import plan_grpo

    cfg = world_cfg(world, student, tmp_path, "questions_per_step=2", "group_size=4", "max_steps=1", *overrides)
    plan = plan_grpo(cfg, 1)
    layout = rl_train.Layout(1, plan.batch.per_device, plan.batch.grad_accum, cfg.rollouts_per_step, "plain",
                             len(plan.questions.rows))
    trainer, tokenizer = rl_train.build_trainer(plan, layout)
    policy = policy_class(tokenizer, world.colour, trainer.model, cfg.prompting.temperature)
    trainer.rollout_func.policy = lambda _trainer: contextlib.nullcontext(policy)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = plan.batch.grad_accum  # what Trainer's loop sets before a step
    return trainer, tokenizer


def test_observation_tokens_never_receive_gradient(world, random_student, tmp_path):
    """TRL's real loss over rollouts of the real loop: the gradient of the loss with respect to
    each completion token's log-probability is exactly 0 at every token the environment wrote
    (observations, the step cues, the final EOS) and non-zero at the policy's own tokens."""
    import torch

    trainer, tokenizer = scripted_trainer(world, random_student, tmp_path, ScriptedPolicy)
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))

    grads = []

    def keep_grad(module, args, output):
        if getattr(output, "log_probs", None) is not None and output.log_probs.requires_grad:
            output.log_probs.register_hook(lambda g: grads.append(g.detach().clone()))

    handle = trainer.model.register_forward_hook(keep_grad)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    handle.remove()
    [grad] = grads
    completion = inputs["completion_ids"]
    grad = grad[:, -completion.size(1):]
    env = inputs["tool_mask"] == 0
    valid = inputs["completion_mask"] == 1
    assert (env & valid).sum() > 0 and (~env & valid).sum() > 0
    assert torch.count_nonzero(grad[env]) == 0  # exactly: no observation token is in the loss
    assert torch.all(inputs["advantages"] != 0)
    assert torch.all(grad[~env & valid] != 0)
    # the masked tokens are the loop's text: the observation of each rollout is among them
    for row in range(completion.size(0)):
        ids = completion[row][valid[row]].tolist()
        env_text = tokenizer.decode([t for t, e in zip(ids, env[row][valid[row]].tolist(), strict=True) if e])
        policy_text = tokenizer.decode([t for t, e in zip(ids, env[row][valid[row]].tolist(), strict=True) if not e])
        assert re.search(r"The colour of \w+ is \w+\.", env_text) and "Episode finished, reward = " in env_text
        assert "Observation" in policy_text and "The colour of" not in policy_text  # stop strings: the policy's


class ScoredPolicy(ScriptedPolicy):
    """STAND-IN for TRL's vLLM engine (labelled as such): ScriptedPolicy's tokens, each with the
    log-probability the policy model gives it in its context at the sampling temperature, as
    vLLM returns them (`logprobs=0`, processed logprobs). Its first step has a stray line after
    the action, so the trace drops sampled tokens (and their log-probabilities) in every rollout."""

    stray = "\nI wait here."

    def generate(self, requests):
        import torch

        out = super().generate(requests)
        for req, [completion] in zip(requests, out, strict=True):
            ids = torch.tensor([req.prompt_ids + completion.token_ids])
            with torch.no_grad():
                logits = self.model(ids).logits[0, len(req.prompt_ids) - 1:-1].float() / self.temperature
            chosen = torch.tensor(completion.token_ids)[:, None]
            completion.token_logprobs = logits.log_softmax(-1).gather(1, chosen)[:, 0].tolist()
        return out


def test_vllm_logprobs_pass_trls_importance_sampling_correction(world, random_student, tmp_path):
    """The vLLM engine's path through TRL's real scoring code: TRL's importance-sampling
    correction (`vllm_importance_sampling_correction`, on by default) subtracts the rollout's
    sampling log-probabilities from the trainer's own, token by token. The trace hands them on
    beside its token ids (0.0 at the loop's tokens): with the engine's log-probabilities equal
    to the model's, every policy token's difference is ~0 and the ratio 1. Every rollout here
    drops the tokens of a stray line the policy wrote after its action: a trace that kept a
    dropped token's value would hand it on at a loop token (where TRL receives 0.0, checked) or,
    with more dropped than the loop appends, shift the next policy tokens (a large difference).
    (Before the trace carried them, the rollout returned logprobs=None and TRL's subtraction
    raised at the first step.) Only the engine is a stand-in; the trainer is switched to vLLM's
    code path after it is built, since vLLM itself is not installed beside TRL here."""
    import torch

    from pipeline.core.storage import read_jsonl

    trainer, _ = scripted_trainer(world, random_student, tmp_path, ScoredPolicy, "prompting.temperature=0.7")
    trainer.rollout_func.engine = "vllm"
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer._last_loaded_step = trainer.state.global_step  # no weight sync: the stand-in reads the model itself
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    [logged] = tmp_path.rglob("rollouts/step-000001.rank-0.jsonl")
    rollouts = read_jsonl(logged, tolerate_torn_tail=False)
    assert len(rollouts) == 8 and all(r["dropped_policy_tokens"] > 0 for r in rollouts)
    loop = (inputs["tool_mask"] == 0) & (inputs["completion_mask"] == 1)
    assert loop.sum() > 0 and torch.all(inputs["sampling_per_token_logps"][loop] == 0.0)
    metrics = trainer._metrics["train"]
    assert metrics["sampling/sampling_logp_difference/max"][-1] < 1e-4
    assert metrics["sampling/importance_sampling_ratio/mean"][-1] == pytest.approx(1.0, abs=1e-4)
    assert inputs["importance_sampling_ratio"].numel() > 0
    assert torch_isfinite(trainer.compute_loss(trainer.model, inputs))


class UnevenPolicy(ScriptedPolicy):
    """STAND-IN for the policy's sampler (labelled as such): ScriptedPolicy's steps with a first
    thought of 0 to 9 extra sentences, so a step's rollouts differ in length as real episodes do."""

    def generate(self, requests):
        out = super().generate(requests)
        for req, [completion] in zip(requests, out, strict=True):
            if self.tokenizer.decode(req.prompt_ids).endswith("Thought 1:"):
                self.calls = getattr(self, "calls", 0) + 1
                name = re.search(r"Search\[(\w+)\]", completion.text).group(1)
                step = f" I search {name}.{' I am not sure yet.' * (self.calls * 7 % 10)}\nAction 1: Search[{name}]" \
                       "\nObservation 1:"
                ids = self.tokenizer(step, add_special_tokens=False)["input_ids"]
                completion.text, completion.token_ids = cut_at_stop(step, req.stop)[0], ids
                completion.completion_tokens = len(ids)
        return out


def step_loss_and_grads(trainer, micro_batches: list[dict]) -> tuple[float, list]:
    """The step's loss (the sum of its micro-batches' as the Trainer accumulates them) and the
    accumulated gradient of every parameter, from zero."""
    trainer.model.zero_grad(set_to_none=True)
    total = 0.0
    for inputs in micro_batches:
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
        total += loss.item()
    return total, [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_trimmed_micro_batches_give_the_same_loss_and_gradient(world, random_student, tmp_path, monkeypatch,
                                                               loss_type):
    """One step's 8 rollouts of uneven lengths, 4 micro-batches of 2 (real TRL scoring and loss on
    the tiny model, fp32): TRL's micro-batches (every one padded to the step's longest rollout)
    against the micro-batches the trainer's own _prepare_inputs hands the step, one per
    accumulation step, from the same rollouts: regrouped by length and trimmed (dapo) or trimmed
    alone (bnpo, normalised per micro-batch: its grouping stays TRL's). Each call returns its own
    step's micro-batch, and the step's loss and every parameter's accumulated gradient agree
    within 1e-5, with fewer padded columns (a regrouping of bnpo moved the loss by 0.01)."""
    import torch

    from pipeline.rl import microbatch

    trainer, _ = scripted_trainer(world, random_student, tmp_path, UnevenPolicy, "per_device_batch_size=2",
                                  f"loss_type={loss_type}")
    assert microbatch.pairing_keeps_the_loss(trainer) == (loss_type == "dapo")
    batch = next(iter(trainer.get_train_dataloader()))
    # A spy (the real regroup, called as it is) keeps TRL's padded micro-batches the override received
    handed, regroup = [], microbatch.regroup
    monkeypatch.setattr(microbatch, "regroup", lambda batches, by_length: handed.append(list(batches))
                        or regroup(batches, by_length))
    assert trainer.args.steps_per_generation == 4 and trainer._step == 0
    returned = []
    for step in range(4):  # the step's 4 accumulation steps: the first generates, the others read the buffer
        trainer._step = step
        returned.append(trainer._prepare_inputs(batch))
    [padded] = handed
    own = list(trainer._buffered_inputs)
    assert len(padded) == len(own) == 4
    assert all(r is o for r, o in zip(returned, own, strict=True))  # each step trains on its own micro-batch
    trimmed = regroup(padded, microbatch.pairing_keeps_the_loss(trainer))
    for a, b in zip(own, trimmed, strict=True):  # the override grouped as the loss type allows
        assert all(torch.equal(a[key], b[key]) for key in ("prompt_ids", "completion_ids", "advantages"))

    def columns(batches):
        return sum(b["prompt_ids"].numel() + b["completion_ids"].numel() for b in batches)

    assert columns(own) < (0.8 if loss_type == "dapo" else 1.0) * columns(padded)  # by length: most padding goes
    def kept(batches, key):  # TRL pads tool_mask with 1: count it where a completion token is
        return sum(int((b[key] * (b["completion_mask"] if key == "tool_mask" else 1)).sum()) for b in batches)

    for key in ("prompt_mask", "completion_mask", "tool_mask"):  # every token kept (the loss alone would not see
        assert kept(own, key) == kept(padded, key)  # a cut final EOS)
    loss_padded, grads_padded = step_loss_and_grads(trainer, padded)
    loss_trimmed, grads_trimmed = step_loss_and_grads(trainer, returned)
    assert loss_trimmed == pytest.approx(loss_padded, abs=1e-5)  # (bnpo's is 0 here: one advantage per micro-batch)
    assert len(grads_padded) == len(grads_trimmed) > 0
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads_padded]))
    assert norm > 0
    for a, b in zip(grads_padded, grads_trimmed, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-5)
    for b in own:  # a fresh step's micro-batches come out trimmed
        assert b["prompt_mask"][:, 0].any() and b["completion_mask"][:, -1].any()


def test_bf16_sampling_weights_sample_as_a_bf16_model_and_leave_the_fp32_weights(world, random_student, tmp_path):
    """rollout precision bf16 (pipeline.rl.policy.sampling_weights, inside transformers_policy):
    while sampling, the trainer's model has bf16 parameters and its seeded samples are token for
    token those of the same checkpoint loaded in bf16; after it, the very same parameter objects
    (the optimizer's) hold their fp32 values again, bit for bit."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.llm.config import LLMConfig
    from pipeline.rl.policy import PolicyLLM, TokenRequest, transformers_policy

    trainer, tokenizer = scripted_trainer(world, random_student, tmp_path, ScriptedPolicy)
    params = list(trainer.model.parameters())
    before = [p.detach().clone() for p in params]
    prompt = tokenizer("Question: What colour is " + next(iter(world.colour)) + "?\nThought 1:")["input_ids"]
    requests = [TokenRequest(prompt="", stop=["\nObservation 1:"], max_new_tokens=16, temperature=1.0, seed=s,
                             prompt_ids=prompt) for s in range(4)]
    with transformers_policy(trainer, 4, None, sample_dtype="bf16") as policy:
        assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
        sampled = [c[0].token_ids for c in policy.generate(requests)]
    assert all(a is b for a, b in zip(params, trainer.model.parameters(), strict=True))
    assert all(p.dtype == torch.float32 and torch.equal(p, b) for p, b in zip(params, before, strict=True))
    bf16 = AutoModelForCausalLM.from_pretrained(random_student, dtype=torch.bfloat16).eval()
    alone = PolicyLLM.from_loaded(LLMConfig(model="policy", max_batch_size=4), bf16, tokenizer)
    assert sampled == [c[0].token_ids for c in alone.generate(requests)]
    assert any(sampled)


def test_rollouts_sample_bf16_only_under_bf16_training(world, random_student, tmp_path):
    """rollout.precision auto follows the training precision; fp32 keeps the fp32 weights."""
    from pipeline.rl.plan import plan_grpo
    from pipeline.rl.train import sample_dtype
    from pipeline.train.plan import plan_training

    def chosen(*overrides):
        cfg = world_cfg(world, random_student, tmp_path, *overrides)
        return sample_dtype(cfg, plan_training(plan_grpo(cfg, 1).student))

    assert chosen("precision=bf16") == "bf16"
    assert chosen("precision=fp32") == "fp32"
    assert chosen("precision=bf16", "rollout.precision=fp32") == "fp32"


VLLM_POLICY_CHILD = """
import json, math, sys
from types import SimpleNamespace as Obj

from transformers import AutoTokenizer

from pipeline.rl.policy import TokenRequest, VLLMPolicy


class StandInEngine:  # STAND-IN for vLLM's offline engine: fixed tokens, their logprobs, then EOS
    def __init__(self, eos):
        self.eos, self.asked = eos, []

    def generate(self, prompts, sampling_params, use_tqdm=False):
        self.asked += [(p["prompt_token_ids"], s) for p, s in zip(prompts, sampling_params)]
        ids = [5, 6, self.eos]
        steps = [{t: Obj(logprob=v, rank=1)} for t, v in zip(ids, (-0.5, math.nan, -0.1))]
        return [Obj(outputs=[Obj(token_ids=ids, logprobs=steps)]) for _ in prompts]


tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
engine = StandInEngine(tokenizer.eos_token_id)
trainer = Obj(vllm_generation=Obj(mode="colocate", llm=engine), processing_class=tokenizer)
policy = VLLMPolicy(trainer, max_context=10)
short = TokenRequest(prompt="", max_new_tokens=24, stop=["Observation"], temperature=1.0, seed=3, prompt_ids=[1] * 4)
full = TokenRequest(prompt="", max_new_tokens=24, stop=["Observation"], temperature=1.0, seed=4, prompt_ids=[1] * 10)
[[a], [b]] = policy.generate([short, full])
[(ids, params)] = engine.asked
print(json.dumps({"a": [a.token_ids, a.token_logprobs, a.finish_reason], "b": [b.finish_reason, b.error],
                  "asked": [len(ids), params.logprobs, params.max_tokens, params.seed]}))
"""


def test_vllm_policy_hands_on_logprobs_and_ends_contexts_over_the_budget(random_student):
    """The colocated vLLM policy (pipeline.rl.policy.VLLMPolicy) with vLLM's real SamplingParams
    (in .venv-vllm, its CPU build) over a STAND-IN engine (labelled: a real engine start costs
    minutes here): each completion carries its tokens' log-probabilities (the EOS's dropped with
    it, vLLM's NaN as None); each request asks for them (logprobs=0) with its budget cut at
    rollout.max_context; a context already at the budget ends as a context-window error and
    never reaches the engine."""
    from vllm_testdata import VLLM_PYTHON, require_vllm

    require_vllm()
    out = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_POLICY_CHILD, str(random_student)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["a"] == [[5, 6], [-0.5, None], "stop"]  # EOS ended it: "stop", EOS and its logprob dropped
    assert got["asked"] == [4, 0, 6, 3]  # 4 context tokens, logprobs=0, budget 10 - 4, the request's seed
    assert got["b"][0] == "error" and "context window exceeded: 10 >= 10 tokens" in got["b"][1]


def torch_isfinite(loss) -> bool:
    import torch

    return bool(torch.isfinite(loss).all())


def test_heldout_curve_is_written_during_a_run_and_read_back(world, random_student, tmp_path):
    """`heldout.every=1` on a 2-step run: the policy's greedy episodes on 4 held-out questions at
    steps 0, 1 and 2, written to heldout.jsonl and drawn as it goes, logged with each step's
    metrics (`heldout/em`, and the rollouts' `rollout/searches`), and read back whole; the
    reward curve carries both columns."""
    from pipeline.rl.heldout import FIGURE, read_points
    from pipeline.rl.train import run

    cfg = world_cfg(world, random_student, tmp_path, "questions_per_step=2", "group_size=2", "max_steps=2",
                    "heldout.every=1", f"heldout.questions={world.questions}", "heldout.limit=4")
    with one_thread():
        run(cfg)
    points = read_points(cfg.output_dir)
    assert [p["step"] for p in points] == [0, 1, 2] and all(p["n"] == 4 for p in points)
    assert all(0 <= p["em"] <= 1 and p["searches"] >= 0 for p in points)
    assert (cfg.output_dir / FIGURE).stat().st_size > 0
    logged = {e["step"]: e for e in log_history(cfg.output_dir)}
    assert [logged[s]["heldout/em"] for s in (1, 2)] == [points[1]["em"], points[2]["em"]]
    assert all("rollout/searches" in logged[s] for s in (1, 2))
    header = (cfg.output_dir / "reward_curve.csv").read_text().splitlines()[0].split(",")
    assert "heldout/em" in header and "rollout/searches" in header


# ----------------------------------------------------------------------------- learning (slow)

@pytest.mark.slow
def test_grpo_learns_to_copy_the_observed_answer(world, warm_student, tmp_path):
    """30 steps of 8 questions x 8 rollouts (in process): the mean reward of the last 5 steps
    exceeds the first 5 steps' by LEARNING_MARGIN; the final/ is a student `eval` reads like any
    other, and greedy EM on the world's 16 questions rises with it; the manifest, card and
    reward curve are written."""
    from pipeline.rl.train import run
    from pipeline.stages.eval import EvalConfig, evaluate

    cfg = world_cfg(world, warm_student, tmp_path / "ck", "questions_per_step=8", "group_size=8", "max_steps=30",
                    "save_steps=15", "peak_tflops=1.0")
    with one_thread():
        manifest = run(cfg)
    rewards = [e["reward"] for e in log_history(cfg.output_dir)]
    assert len(rewards) == 30
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"[grpo learning] mean reward of the first 5 steps {first:.3f}, of the last 5 {last:.3f}")
    assert last - first >= LEARNING_MARGIN, rewards
    assert manifest["grpo"]["reward_first_steps"] == pytest.approx(first, abs=1e-3)
    history = json.loads((cfg.output_dir / "checkpoint-30" / "trainer_state.json").read_text())["log_history"]
    # the launch's first step is warm-up: no figures (pipeline.train.flops.ThroughputMeter); every later one has them
    assert "mfu" not in history[0] and history[0]["step"] == 1
    assert all(e.get("mfu", 0) > 0 and e["tokens_per_s_per_device"] > 0 for e in history if "loss" in e and e["step"] > 1)
    final = cfg.output_dir / "final"
    assert (final / "README.md").read_text().startswith("---") and "GRPO" in (final / "README.md").read_text()
    assert (cfg.output_dir / "reward_curve.png").stat().st_size > 0
    assert len((cfg.output_dir / "reward_curve.csv").read_text().splitlines()) == 31
    rollouts = [json.loads(line) for line in (cfg.output_dir / "rollouts" / "step-000030.rank-0.jsonl").open()]
    assert len(rollouts) == 64 and all(r["text"].startswith("Question: What colour is") for r in rollouts)

    def greedy_em(checkpoint: Path, out: Path) -> float:
        eval_cfg = load_config(EvalConfig, None, [
            f"finetuned={checkpoint}", f"questions={world.questions}", f"wiki.index={world.index}",
            f"wiki.corpus=[{world.corpus}]", f"out_dir={out}", "prompting.max_new_tokens=24",
            "prompting.max_steps=4", "model.dtype=float32", "size_class=tiny", "params_b=0.0001"])
        [row] = evaluate(eval_cfg)
        return row["em"]

    assert greedy_em(final, tmp_path / "eval-after") > greedy_em(warm_start_final(warm_student, tmp_path), tmp_path / "eval-before")


def warm_start_final(warm_student: Path, tmp_path: Path) -> Path:
    """The warm start as eval reads a fine-tuned student: its folder with a manifest (as SFT's)."""
    import shutil

    from pipeline.core.storage import write_manifest

    final = tmp_path / "warm-final"
    shutil.copytree(warm_student, final)
    write_manifest(final / "manifest.json", stage="train", config={}, complete=True, student="warm",
                   format="react", adapter=False, size_class="tiny", params_b=0.0001)
    return final


# ----------------------------------------------------------------------------- real launches (slow)

SMALL = ("questions_per_step=2", "group_size=4", "save_steps=2", "log_rollouts=false")  # 8 rollouts per step
COMPARED = ("loss", "reward", "grad_norm", "rewards/em/mean", "completions/mean_length")


@pytest.fixture(scope="module")
def reference(world, warm_student, tmp_path_factory) -> dict[int, dict]:
    """One uninterrupted 8-step run in this process: every launch below must log the same steps."""
    from pipeline.rl.train import run

    cfg = world_cfg(world, warm_student, tmp_path_factory.mktemp("rl-ref"), *SMALL, "max_steps=8")
    with one_thread():
        run(cfg)
    return {e["step"]: e for e in log_history(cfg.output_dir)}


def grpo_launch(world, student: Path, out: Path, *overrides: str, config: str = "cpu",
                processes: int = 1) -> subprocess.Popen:
    """`python -m pipeline grpo ...`: the stage, which launches `accelerate launch -m pipeline.rl.train`."""
    on_cpu = ("deepspeed_on_cpu=true",) if config.startswith("deepspeed") else ()  # refused on CPU unless asked for
    cmd = [PYTHON, "-m", "pipeline", "grpo", *world_args(world, student, out, *overrides, *on_cpu),
           f"accelerate_config={config}", "--num-processes", str(processes)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = open(out / f"launch-{time.monotonic_ns()}.log", "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    proc.log_path = Path(log.name)
    return proc


def assert_same_steps(run: dict[int, dict], reference: dict[int, dict], steps) -> None:
    for step in steps:
        for key in COMPARED:
            assert run[step][key] == pytest.approx(reference[step][key], abs=LOSS_TOLERANCE), (step, key)


@pytest.mark.slow
def test_killed_launch_resumes_with_the_uninterrupted_runs_steps(world, warm_student, reference, tmp_path):
    """SIGKILL a real one-process launch as soon as its checkpoint-2 is complete; the same
    command resumes from the latest complete checkpoint, re-samples the same rollouts (seeded
    by step), and every step's loss, reward and gradient norm equal the uninterrupted run's."""
    from pipeline.train.checkpoints import latest_complete_checkpoint
    from pipeline.train.checks import is_complete_checkpoint

    args = (*SMALL, "max_steps=8")
    run_dir = world_cfg(world, warm_student, tmp_path, *args).output_dir
    proc = grpo_launch(world, warm_student, tmp_path, *args)
    deadline = time.time() + LAUNCH_TIMEOUT
    while not is_complete_checkpoint(run_dir / "checkpoint-2"):
        assert proc.poll() is None and time.time() < deadline, proc.log_path.read_text()[-3000:]
        time.sleep(0.02)
    kill_tree(proc)
    proc.wait()
    last = latest_complete_checkpoint(run_dir)
    assert last is not None and not (run_dir / "final").exists(), "the kill came after the run ended"
    log = finish(grpo_launch(world, warm_student, tmp_path, *args), timeout=LAUNCH_TIMEOUT)
    assert f"[grpo] resuming from {last}" in log
    resumed = {e["step"]: e for e in log_history(run_dir)}
    assert sorted(resumed) == list(range(1, 9)), "the step count continues, no step repeated"
    assert_same_steps(resumed, reference, range(1, 9))
    assert json.loads((run_dir / "final" / "manifest.json").read_text())["steps"] == 8


@pytest.mark.slow
def test_two_process_ddp_launch_matches_one_process(world, warm_student, reference, tmp_path):
    """cpu_ddp (2 processes over gloo): each process runs its share of the step's rollouts; the
    rewards are gathered, the gradients averaged: the same steps as one process."""
    log = finish(grpo_launch(world, warm_student, tmp_path, *SMALL, "max_steps=4", config="cpu_ddp", processes=2),
                 timeout=LAUNCH_TIMEOUT)
    assert "4 per device x 1 accumulation x 2 processes" in log
    # TRL's notice that rollout_func is experimental (each rank printed it): said once, in our words
    assert "which is an experimental feature" not in log and log.count(EXPERIMENTAL_TRL_LINE) == 1, log[-3000:]
    run_dir = world_cfg(world, warm_student, tmp_path, *SMALL).output_dir
    assert_same_steps({e["step"]: e for e in log_history(run_dir)}, reference, range(1, 5))
    manifest = json.loads((run_dir / "final" / "manifest.json").read_text())
    assert (manifest["num_processes"], manifest["stage"], manifest["format"]) == (2, "grpo", "react")


@pytest.mark.slow
def test_deepspeed_zero3_launch(world, warm_student, reference, tmp_path):
    """DeepSpeed ZeRO-3 on 2 CPU processes (fp32): the policy is partitioned as it loads (the
    GRPO arguments, which register DeepSpeed's config, exist before from_pretrained), its parameters are gathered for the
    rollouts (TRL's unwrap_model_for_generation), the steps match one process's, the checkpoint
    is DeepSpeed's and complete, final/ holds the gathered model. On a fresh machine DeepSpeed
    first compiles its CPU communication op (~1-2 min, cached in ~/.cache/torch_extensions)."""
    pytest.importorskip("deepspeed")
    from pipeline.train.checks import is_complete_checkpoint

    log = finish(grpo_launch(world, warm_student, tmp_path, *SMALL, "max_steps=2", config="deepspeed_zero3",
                             processes=2), timeout=900)
    assert "4 per device x 1 accumulation x 2 processes" in log
    # each rank loaded only its shard (zero.Init active at from_pretrained), not the whole policy
    assert re.search(r"\[grpo\] ZeRO-3: the policy was partitioned as it loaded \(zero.Init\): this rank holds "
                     r"[\d,]+ of [\d,]+ parameters", log), log[-3000:]
    run_dir = world_cfg(world, warm_student, tmp_path, *SMALL).output_dir
    assert (run_dir / "checkpoint-2" / "latest").is_file() and is_complete_checkpoint(run_dir / "checkpoint-2")
    assert_same_steps({e["step"]: e for e in log_history(run_dir)}, reference, range(1, 3))
    final = run_dir / "final"
    assert json.loads((final / "manifest.json").read_text())["precision"] == "fp32"
    assert (final / "model.safetensors").stat().st_size > 100_000


NODE_CHILD = """
import os, sys
from types import SimpleNamespace

from accelerate import PartialState

import pipeline.wiki.index as index_module
from pipeline.rl.train import open_environment
from pipeline.wiki.config import WikiConfig

state = PartialState(cpu=True)
build = index_module.build_index


def logged_build(corpus, out, *args, **kwargs):  # the real build, with a line saying who built where
    with open(sys.argv[1], "a") as log:
        log.write(f"{state.process_index} {os.getcwd()}\\n")
    return build(corpus, out, *args, **kwargs)


index_module.build_index = logged_build
open_environment(SimpleNamespace(wiki=WikiConfig(index="index.sqlite", corpus=[sys.argv[2]])))
state.wait_for_everyone()
"""


def test_the_index_is_built_once_per_machine(world, tmp_path):
    """Two "machines" on 127.0.0.1 (two real `torchrun` launches, 2 processes each, gloo), each
    in its own folder standing for its own disk, with the index missing on both: GRPO's
    environment set-up (pipeline.rl.train.open_environment) builds it exactly once per machine,
    by the first process there, the others reading it. (With accelerate's main_process_first
    alone, the second machine's two processes were released together and both built it.)"""
    from test_multinode import free_port

    script, log = tmp_path / "child.py", tmp_path / "builds.log"
    script.write_text(NODE_CHILD)
    port, env = free_port(), {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    nodes = []
    for rank in (0, 1):
        disk = tmp_path / f"machine-{rank}"
        disk.mkdir()
        cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node",
               "2", "--master_addr", "127.0.0.1", "--master_port", str(port), str(script), str(log), str(world.corpus)]
        nodes.append(subprocess.Popen(cmd, cwd=disk, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    for node in nodes:
        out, _ = node.communicate(timeout=300)
        assert node.returncode == 0, out[-3000:]
    builds = sorted(line.split() for line in log.read_text().splitlines())
    assert [folder for _, folder in builds] == [str(tmp_path / "machine-0"), str(tmp_path / "machine-1")], builds
    assert [int(rank) for rank, _ in builds] == [0, 2]  # each machine's first process
    assert all((tmp_path / f"machine-{r}" / "index.sqlite").is_file() for r in (0, 1))


# ----------------------------------------------------------------------------- SmolLM2 on real questions (slow)

@pytest.mark.slow
def test_smollm2_lora_smoke_on_real_offline_questions(smollm2_dir, index, tmp_path):
    """SmolLM2-135M (the embedded model), a new LoRA adapter, 2 steps of 1 real offline-bootstrap
    question x 2 rollouts through the real 26k-page index, the hardware's precision: it runs,
    its trace rebuilds every episode's text with SmolLM2's byte-level BPE (or the run stops),
    and `eval` resolves the adapter final/ on its base."""
    from pipeline.rl.train import run
    from pipeline.stages.eval import EvalConfig, model_under_test

    cfg = resolve(load_config(GrpoConfig, None, [
        "student=smollm2", "questions=offline-bootstrap", "limit=4", f"wiki.index={index}",
        f"output_root={tmp_path}", "questions_per_step=1", "group_size=2", "max_steps=2", "save_steps=2",
        "finetuning=lora", "prompting.max_new_tokens=16", "prompting.max_steps=3", "learning_rate=1e-5"]))
    with one_thread():
        manifest = run(cfg)
    assert manifest["adapter"] and manifest["steps"] == 2 and manifest["base_model"] == str(smollm2_dir)
    rollouts = [json.loads(line) for f in sorted((cfg.output_dir / "rollouts").glob("*.jsonl")) for line in f.open()]
    assert len(rollouts) == 4 and all(r["text"].startswith("Question: ") for r in rollouts)
    assert all(r["policy_tokens"] > 0 and r["env_tokens"] > 0 for r in rollouts)
    target = model_under_test(load_config(EvalConfig, None, [f"finetuned={cfg.output_dir / 'final'}"]))
    assert (target.llm.model, target.llm.adapter, target.trained_format) == \
           (str(smollm2_dir), str(cfg.output_dir / "final"), "react")


def test_a_grids_vllm_grpo_unit_without_vllm_is_refused_at_the_plan(capsys, monkeypatch, tmp_path):
    """`run` of a grid whose grpo unit rolls out with vLLM, where no interpreter has vLLM: one
    line naming the unit, when the plan is made (before: at the grpo phase, hours in, after the
    launched child had loaded the policy)."""
    from pipeline.cli import main
    from pipeline.llm import interpreter

    monkeypatch.setenv(interpreter.PYTHON_ENV, str(tmp_path / "no-vllm-env" / "bin" / "python"))
    assert main(["run", "--config", str(REPO / "configs" / "small-rounds.yaml"), "--print-config",
                 "grpo.settings.rollout.engine=vllm", "grpo.settings.rollout.max_context=512"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "grpo: smollm2-135m" in err and "vLLM is not installed for" in err, err
