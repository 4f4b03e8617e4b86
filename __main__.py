"""gpuhost: `pulumi up` a stack of GPU servers (see README.md). Config → components lives in stacks/program.py."""

import pulumi

from stacks.load import load

# Every bad field reported at once, and the components listed and checked, before the first resource.
program = load(pulumi.Config("gpuhost"))
for name, value in program.declare().items():
    pulumi.export(name, value)
