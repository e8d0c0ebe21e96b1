"""The chat template that renders tool calls for SmolLM2 (its own renders content only).

    from transformers import AutoTokenizer
    from pipeline.hub.chat_template import with_tool_calls
    tokenizer = with_tool_calls(AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct"))

The template (smollm2_tool_calls.jinja beside this file) is ChatML, as SmolLM2's, with Hermes-style
`<tool_call>` JSON and `{% generation %}` markers around the assistant's turns, so TRL's
`assistant_only_loss=True` trains on them alone (docs/formats.md, "Messages layout"). It fits any
tokenizer with `<|im_start|>` / `<|im_end|>` turns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOOL_CALLS_TEMPLATE = Path(__file__).with_name("smollm2_tool_calls.jinja")


def tool_calls_template() -> str:
    return TOOL_CALLS_TEMPLATE.read_text(encoding="utf-8")


def with_tool_calls(tokenizer: Any) -> Any:
    """The tokenizer with the tool-call template as its chat template (it is returned, changed)."""
    tokenizer.chat_template = tool_calls_template()
    return tokenizer
