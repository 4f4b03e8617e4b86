"""gpuhost: `pulumi up` a stack of GPU servers (see README.md). Config → components lives in stacks/program.py."""

import pulumi

from stacks.load import guest_public_key, load
from stacks.program import build

fleet, _ssh_key = load(pulumi.Config("gpuhost"))  # every bad field reported at once, before any resource
# new guests authorize the public half of the key gpuhost reaches them with (cloud-init); the private key stays secret
outputs = build(fleet, guest_keys=(guest_public_key(pulumi.Config("gpuhost")),))
for name, value in outputs.items():
    pulumi.export(name, value)
