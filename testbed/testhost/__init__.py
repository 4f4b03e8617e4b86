"""The emulated GPU server every provider test uses: a real Debian 12 host under QEMU.

Build the cached base image with ``python -m testbed.testhost build``; start one by hand with
``python -m testbed.testhost start`` (prints what to put in ``Pulumi.dev.yaml``). Pytest fixtures are in
`testbed.testhost.fixtures`.
"""
