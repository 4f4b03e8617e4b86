"""What the tests, the benchmarks and the tools stand on: real local servers and the emulated GPU server.

* ``servers``: sshd, Triton, nginx, Redis, Prometheus, node_exporter and the gateway worker on loopback ports;
* ``testhost``: the emulated GPU server (Debian 12 under QEMU), its pytest fixtures and the PassthroughHost values
  tests and benchmarks give it (``testhost.passthrough``);
* ``provider_server``: the SDK's dynamic-provider gRPC server, the calls the engine makes;
* ``mocks``: the whole program under Pulumi mocks, every registration recorded;
* ``stackfiles``: the stack files with a throwaway key of their own.

tests/, bench/ and tools/ import from here; nothing here imports from tests/.
"""
