"""MigGpus: the MIG partitions of a host's own (not passed-through) GPUs, seed 001 route A.

One MigLayout child, named `{name}-mig` (it was declared outside any component before; the alias keeps it the same
resource, no re-partitioning). `mig_uuids` feed the TritonServices bound to a MIG instance.

Usage::

    mig = MigGpus("a100-mig-01", MigGpusArgs(host=spec, layout={"0": ["3g.40gb", "3g.40gb"]}),
                  ResourceOptions(depends_on=[passthrough_host]))
    mig.mig_uuids   # {"0": ["MIG-…", "MIG-…"]}
"""

from __future__ import annotations

from typing import Any

import pulumi
from pydantic import BaseModel, ConfigDict

from access.ssh import HostSpec
from components.wiring import Child, Wired
from providers.base import host_input
from providers.mig import MigLayout


class MigGpusArgs(BaseModel):
    """Args:
    host: the server (SSH).
    layout: MIG profiles per GPU index as nvidia-smi numbers them (PCI bus order of the host's own GPUs).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: HostSpec
    layout: dict[str, list[str]]


def children(name: str, args: MigGpusArgs) -> list[Child]:
    return [
        Child(
            "mig",
            MigLayout,
            {"host": host_input(args.host), "layout": {k: list(v) for k, v in args.layout.items()}},
            aliases=(pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE),),
        )
    ]


class MigGpus(Wired, type_name="gpuhost:gpu:MigGpus", children=children):
    def wire(self, args: MigGpusArgs, made: dict[str, Any]) -> dict[str, Any]:
        self.layout = made["mig"]
        self.mig_uuids = self.layout.mig_uuids
        return {"mig_uuids": self.mig_uuids}
