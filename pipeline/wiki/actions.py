"""Parse an agent's action text (`Search[x]`, `Lookup[y]`, `Finish[z]`) the way ReAct does.

The original loop lower-cases the action's first letter and then matches `search[...]` with
`startswith`/`endswith`, so the argument runs from the first `[` to the LAST `]` (nested
brackets survive: `Search[Adam [film]]` searches `Adam [film]`). We also accept any case of the
name and stray spaces around it, which small models produce; anything else is invalid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTION_NAMES = ("search", "lookup", "finish")
_ACTION = re.compile(r"^\s*([A-Za-z]+)\s*\[(.*)\]\s*$", re.DOTALL)


@dataclass(frozen=True)
class Action:
    name: str  # search | lookup | finish
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
