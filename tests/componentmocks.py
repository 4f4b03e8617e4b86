"""Pulumi mocks for one component's tests: every registration recorded, each resource's outputs its inputs plus
what the provider would add (a Pulumi mock, since no engine runs in these tests; testbed/mocks.py runs the whole
stack program the same way).

Usage::

    mocks = use_mocks(docker_outputs, stack_key=True)   # then a @pulumi.runtime.test program; mocks.resources
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import pulumi

from testbed.stackfiles import throwaway_key

Outputs = Callable[[Any, dict], None]


class Recorder(pulumi.runtime.Mocks):
    def __init__(self, outputs: Optional[Outputs] = None):
        self.resources: list = []
        self.outputs = outputs

    def new_resource(self, args):
        self.resources.append(args)
        outs = dict(args.inputs)
        if self.outputs is not None:
            self.outputs(args, outs)
        return [f"{args.name}-id", outs]

    def call(self, args):
        return {}


def docker_outputs(args: Any, outs: dict) -> None:
    """What the Docker provider adds: a pulled image's id."""
    if args.typ == "docker:index/remoteImage:RemoteImage":
        outs["imageId"] = "sha256:" + "0" * 64


def use_mocks(outputs: Optional[Outputs] = None, *, stack_key: bool = False) -> Recorder:
    """A fresh Recorder as the runtime's mocks (project gpuhost, stack test, not a preview); with `stack_key`, the
    stack's SSH key in config, as the Docker engines reach machines with it (access/docker_ssh.py)."""
    mocks = Recorder(outputs)
    pulumi.runtime.set_mocks(mocks, project="gpuhost", stack="test", preview=False)
    if stack_key:
        pulumi.runtime.set_all_config({"gpuhost:sshPrivateKey": throwaway_key()}, ["gpuhost:sshPrivateKey"])
    return mocks
