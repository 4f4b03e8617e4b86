"""What applying a change does to what runs, in an operator's words: the head of a pull request's plan diff.

A provider knows which of its changes restart a service, shut a VM down or run a load against production; it says
so in `Provider.effects(olds, news)` (olds None on a create), and names the inputs that only carry a hash of other
inputs in `Provider.DERIVED` (a restart trigger, a repository digest, a file's sha256 beside its content).
tools/plan_diff asks the head commit's own provider, as it asks its `diff`, and writes the comment's head lines
(**Restarts:**, **Gates re-run:**) from the answers; the derived inputs are counted, not listed.

Effect fields: `kind` "restart" (a service, container or VM goes down and comes back, or reloads) or "gate" (an
acceptance load runs against the serving endpoint); `host` the machine (its fleet name); `what` the unit, VM, GPU or
model; `how` the provider's own words, never an input value (values from the stack go in `host`, `what`, `load`,
which the comment prints as code); `load`, for a gate, its size from the gate's inputs.

Usage::

    class SystemdServiceProvider(TemplateProvider):
        DERIVED = (("trigger",),)
        def effects(self, olds, news):
            return [Effect("restart", host_name(news), news["unit"], "restarts")] if olds else []
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# An input path pattern: keys and list positions from the input's root, "*" for any one key.
Path = tuple[str, ...]


@dataclass(frozen=True)
class Effect:
    kind: Literal["restart", "gate"]
    host: str
    what: str
    how: str
    load: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def host_name(props: dict) -> str:
    """The fleet name of the `host` input ("" when there is none)."""
    h = props.get("host")
    return str(h.get("name") or "") if isinstance(h, dict) else str(h or "")


def matches(path: tuple, pattern: Path) -> bool:
    """Whether an input path starts with `pattern` ("*" matches any one key).

    >>> matches(("files", "a/config.pbtxt", "sha256"), ("files", "*", "sha256"))
    True
    """
    return len(path) >= len(pattern) and all(p == "*" or p == k for k, p in zip(path, pattern, strict=False))
