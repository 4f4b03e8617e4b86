"""The steps of one operation (preview, update, refresh, destroy) and its outcome, printed as the CLI prints them.

An `Outcome` is what `Driver.preview/up/refresh/destroy` return: each step the engine took (or, in a preview, would
take), the stack's outputs, the errors and the duration. It is not a plan: `plans/` holds the pure action lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.driver.display import print_object, print_object_diff

# ---- steps and the outcome --------------------------------------------------------------------------------------

SYMBOLS = {
    "create": "+",
    "update": "~",
    "replace": "+-",
    "delete": "-",
    "same": " ",
    "refresh": "~",
    "read": ">",
    "skip": "⊘",
}


@dataclass
class Step:
    op: str
    urn: str
    type: str
    old: dict | None = None  # old inputs (or outputs for refresh)
    new: dict | None = None  # new (checked) inputs
    keys: list[str] = field(default_factory=list)
    replace_keys: list[str] = field(default_factory=list)
    seconds: float = 0.0
    started: float = 0.0
    error: str | None = None

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]


@dataclass
class Outcome:
    """One operation's steps, outputs and errors. `kind`: "preview", "update", "refresh" or "destroy" (or "delete":
    the deletes an update runs after the program, folded into its own outcome)."""

    kind: str
    steps: list[Step] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.steps:
            op = "failed" if s.error else s.op
            out[op] = out.get(op, 0) + 1
        return out

    def changes(self) -> int:
        return sum(1 for s in self.steps if s.op not in ("same", "read"))

    def of(self, op: str) -> list[Step]:
        return [s for s in self.steps if s.op == op]

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def render(self) -> str:
        lines = []
        for s in self.steps:
            # up and destroy print each step as it finishes; their summary lists only failures
            # a preview lists what the program reads (`>` in the CLI); a refresh's reads are its no-drift steps
            if s.op == "same" or (s.op == "read" and self.kind != "preview"):
                continue
            if self.kind in ("update", "destroy") and not s.error and s.op != "skip":
                continue
            diff = ""
            if s.keys and s.op in ("update", "replace", "refresh"):
                # the CLI's progress line: `[diff: ~key]`, replacing keys listed the same way
                diff = "  [diff: " + ", ".join(f"~{k}" for k in s.keys) + "]"
            elif s.op == "skip":
                diff = "  (depends on " + ", ".join(s.keys) + ")"
            lines.append(
                f"  {SYMBOLS[s.op]:<2} {s.type}  {s.name}  ({s.op}){diff}"
                + (f"  [{s.seconds:.1f}s]" if s.seconds >= 0.05 and self.kind != "preview" else "")
            )
            lines += self._details(s)
            if s.error:
                lines.append(f"      error: {s.error}")
        c = self.counts()
        lines.append("Resources:")
        done = {
            "create": "created",
            "update": "updated",
            "replace": "replaced",
            "delete": "deleted",
            "refresh": "drifted",
            "skip": "skipped",
        }
        if c.get("failed"):
            lines.append(f"    ✗ {c['failed']} failed")
        for op in ("create", "update", "replace", "delete", "refresh", "skip"):
            if c.get(op):
                lines.append(
                    f"    {SYMBOLS[op]} {c[op]} "
                    + (f"to {op}" if self.kind == "preview" and op != "refresh" else done[op])
                )
        lines.append(f"    {c.get('same', 0) + c.get('read', 0)} unchanged")
        if self.outputs:
            lines.append("Outputs:")
            lines += print_object(self.outputs, indent=1)
        for e in self.errors:
            lines.append(f"error: {e}")
        lines.append(f"Duration: {self.seconds:.0f}s")
        return "\n".join(lines)

    def _details(self, s: Step) -> list[str]:
        """The step's properties as `pulumi preview --diff` prints them (pkg/backend/display/object_diff.go
        getResourcePropertiesDetails): a create's new inputs, a delete's old ones, otherwise the old/new diff."""
        old, new = s.old or {}, s.new or {}
        if s.op == "create":
            return print_object(new, indent=2)
        if s.op == "delete":
            return print_object(old, indent=2)
        if s.op in ("update", "replace", "refresh"):
            return print_object_diff(old, new, indent=2)
        return []
