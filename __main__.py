"""gpuhost: `pulumi up` a stack of GPU servers (see README.md). Config → components lives in stacks/program.py."""

import pulumi

from stacks.load import load
from stacks.program import build

fleet, _ssh_key = load(pulumi.Config("gpuhost"))  # every bad field reported at once, before any resource
outputs = build(fleet)
for name, value in outputs.items():
    pulumi.export(name, value)
