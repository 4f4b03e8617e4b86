"""The emulated GPU server every provider test uses: a real Debian 12 host under QEMU.

Build the cached base image with ``python -m tests.testhost build``; start one by hand with
``python -m tests.testhost start`` (prints what to put in ``Pulumi.dev.yaml``). Pytest fixtures are in
`tests.testhost.fixtures`.
"""
