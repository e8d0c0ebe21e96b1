"""The student a run trains: loaded in the plan's dtype and attention, quantised for QLoRA, with the
LoRA adapter's config for PEFT.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.hub.models import resolve_model_path
from pipeline.train.config import FinetuneConfig
from pipeline.train.plan import TrainPlan


def load_student(cfg: FinetuneConfig, tokenizer, plan: TrainPlan):
    """The student in the plan's dtype and attention: the pretrained model, or a random Llama
    sized by `random_model` (tests)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if cfg.init == "random":
        torch.manual_seed(cfg.seed)  # identical on every rank
        dims = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 4, "intermediate_size": 128, "max_position_embeddings": 2048,
                **cfg.random_model}
        config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **dims)
        config._attn_implementation = plan.attention
        return LlamaForCausalLM(config).to(plan.weights.torch_dtype)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    kwargs["attn_implementation"] = plan.attention
    if cfg.finetuning == "qlora":
        kwargs["quantization_config"] = qlora_quantization(plan.bf16)
    kwargs["dtype"] = plan.weights.torch_dtype
    name = resolve_model_path(cfg.student)
    try:
        return AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except OSError as exc:
        raise PipelineError(f"student: cannot load '{name}' ({str(exc).splitlines()[0]})") from None


def qlora_quantization(bf16: bool):
    import importlib.util

    import torch
    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        raise PipelineError("finetuning: qlora needs CUDA and bitsandbytes (pip install bitsandbytes); use lora on this machine")
    return bnb_4bit_config(bf16)


def bnb_4bit_config(bf16: bool):
    import torch
    from transformers import BitsAndBytesConfig
    compute = torch.bfloat16 if bf16 else torch.float16
    # The 4-bit weights are stored packed in a tensor of dtype quant_storage. ZeRO-3 and FSDP shard
    # and all-gather parameters as floating tensors of one dtype: the default uint8 storage breaks
    # ZeRO-3's gather and makes FSDP2 leave the 4-bit base unsharded (accelerate fsdp_utils).
    # Storing in the compute dtype is what both need, and changes nothing on one GPU.
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute, bnb_4bit_quant_storage=compute)


def peft_config(cfg: FinetuneConfig):
    if cfg.finetuning == "full":
        return None
    from peft import LoraConfig
    return LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
