"""Released fine-tuned agents this pipeline knows by hub id: base model, format, size, source.

    python -m pipeline eval finetuned=forestai/fireact_llama_2_7b_lora questions=react-dev500 wiki.backend=live

`eval finetuned=<hub id>` looks the id up here, so nothing else is needed: the adapter names its
base model in its adapter_config.json (which wins when it names a hub id or an existing folder),
the format says how the agent decodes (pipeline.hub.finetuned.DECODE_FORMATS), and the size places
it on the figure. A local copy whose folder name is the id's last part (`hf download
forestai/fireact_llama_2_7b_lora --local-dir fireact_llama_2_7b_lora`) is recognised too.

Sources: FireAct's README "Model Zoo" (github.com/anchen1011/FireAct: multitask models, LoRA on
Llama-2 / CodeLlama, one full Llama-2-7B); its fine-tuning README uses the `-chat-hf` Llama-2
models as bases; the CodeLlama bases here are the README's names as `codellama/*-hf` ids, not
verified (the adapter's adapter_config.json decides when it names a hub id). AgentTuning's model cards (huggingface.co/THUDM/agentlm-7b): full models trained
from Llama-2-chat, in Llama-2-chat's conversation format with a fixed system prompt.
Sizes: Llama-2-7B 6.74B, 13B 13.0B, 70B 69.0B parameters; CodeLlama-34B 33.7B.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FIREACT_SOURCE = "FireAct (Chen et al. 2023), github.com/anchen1011/FireAct, README 'Model Zoo'"
AGENTLM_SOURCE = "AgentTuning (Zeng et al. 2023), github.com/THUDM/AgentTuning; model card huggingface.co/THUDM/agentlm-7b"


@dataclass(frozen=True)
class ReleasedAgent:
    hub_id: str
    label: str  # the figure's and table's name for it
    format: str  # how it decodes: fireact | agentlm | one of ours (standard, cot, act, react)
    base_model: str | None  # what a LoRA adapter applies to; None for a full model
    size_class: str
    params_b: float
    source: str
    licence: str

    @property
    def adapter(self) -> bool:
        return self.base_model is not None


def _fireact(name: str, label: str, base: str | None, size_class: str, params_b: float) -> ReleasedAgent:
    return ReleasedAgent(f"forestai/{name}", f"FireAct {label} (released)", "fireact", base, size_class,
                         params_b, FIREACT_SOURCE, "MIT (adapter); the base model's own licence applies")


def _agentlm(size: str, params_b: float) -> ReleasedAgent:
    return ReleasedAgent(f"THUDM/agentlm-{size}", f"AgentLM-{size.upper()} (released)", "agentlm", None, size,
                         params_b, AGENTLM_SOURCE, "Llama 2 Community License")


AGENTS: dict[str, ReleasedAgent] = {a.hub_id: a for a in (
    _fireact("fireact_llama_2_7b_lora", "Llama-2-7B LoRA", "meta-llama/Llama-2-7b-chat-hf", "7b", 6.74),
    _fireact("fireact_llama_2_13b_lora", "Llama-2-13B LoRA", "meta-llama/Llama-2-13b-chat-hf", "13b", 13.0),
    _fireact("fireact_llama_2_7b", "Llama-2-7B full", None, "7b", 6.74),
    _fireact("fireact_codellama_7b_lora", "CodeLlama-7B LoRA", "codellama/CodeLlama-7b-hf", "7b", 6.74),
    _fireact("fireact_codellama_13b_lora", "CodeLlama-13B LoRA", "codellama/CodeLlama-13b-hf", "13b", 13.0),
    _fireact("fireact_codellama_34b_lora", "CodeLlama-34B LoRA", "codellama/CodeLlama-34b-hf", "34b", 33.7),
    _agentlm("7b", 6.74),
    _agentlm("13b", 13.0),
    _agentlm("70b", 69.0),
)}


def find_agent(finetuned: str) -> ReleasedAgent | None:
    """The registry entry for a hub id, or for a local copy named after the id's last part."""
    if finetuned in AGENTS:
        return AGENTS[finetuned]
    name = Path(str(finetuned).rstrip("/")).name
    matches = [a for a in AGENTS.values() if a.hub_id.split("/")[-1] == name]
    return matches[0] if len(matches) == 1 else None
