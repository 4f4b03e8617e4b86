"""A resource as the driver stores it in its state file."""

from __future__ import annotations

from dataclasses import dataclass, field

# ---- state ------------------------------------------------------------------------------------------------------


@dataclass
class Resource:
    urn: str
    type: str
    custom: bool
    parent: str = ""
    id: str = ""
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    dependencies: list[str] = field(default_factory=list)
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    delete_before_replace: bool = False
    # Read with ReadResource (`get`, a StackReference): the engine's External, never deleted through the provider
    external: bool = False
    # The old half of a create-before-delete replacement whose run ended before deleting it: the engine's
    # `Delete: true`, deleted at the end of the next up (step_generator.go GenerateDeletes) or by destroy
    pending_delete: bool = False

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: dict) -> Resource:
        return cls(**d)
