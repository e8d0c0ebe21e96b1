"""Parse an agent's action text (`Search[x]`, `Lookup[y]`, `Finish[z]`) the way ReAct does.

The original loop lower-cases the action's first letter and then matches `search[...]` with
`startswith`/`endswith`, so the argument runs from the first `[` to the LAST `]` (nested
brackets survive: `Search[Adam [film]]` searches `Adam [film]`). We also accept any case of the
name and stray spaces around it, which small models produce; anything else is invalid.

`parse_action_original` is wikienv.py's own test, for the paper's mode: after `strip()`, the text
must start with `search[`, `lookup[`, `finish[` or `think[` (lower-case, no space before `[`) and
end with `]`; the argument is everything between, unstripped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTION_NAMES = ("search", "lookup", "finish")
ORIGINAL_ACTION_NAMES = ("search", "lookup", "finish", "think")
_ACTION = re.compile(r"^\s*([A-Za-z]+)\s*\[(.*)\]\s*$", re.DOTALL)


@dataclass(frozen=True)
class Action:
    name: str  # search | lookup | finish (| think, original parser only)
    argument: str


def parse_action(text: str) -> Action | None:
    """The action in `text`, or None when it is not one of Search/Lookup/Finish[...]."""
    match = _ACTION.match(text or "")
    if not match:
        return None
    name = match.group(1).lower()
    if name not in ACTION_NAMES:
        return None
    return Action(name, match.group(2).strip())


def parse_action_original(text: str) -> Action | None:
    """wikienv.py's `step` parsing, exactly (see the module docstring)."""
    action = (text or "").strip()
    for name in ORIGINAL_ACTION_NAMES:
        if action.startswith(f"{name}[") and action.endswith("]"):
            return Action(name, action[len(name) + 1:-1])
    return None


def env_action(action: str) -> str:
    """The original loop's `action[0].lower() + action[1:]`."""
    return action[0].lower() + action[1:] if action else action
