import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The emulated GPU server's fixtures (testbed/: shared with bench/ and tools/).
pytest_plugins = ["testbed.testhost.fixtures"]

# No per-example deadline (hypothesis's default is 200 ms) and no too_slow health check: on the shared 2-core CI machine
# an example's time says how busy the machine is, not whether the code is right.
settings.register_profile("gpuhost", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpuhost")


@pytest.fixture(scope="module")
def local_sshd():
    """A real sshd on loopback with per-run keys; yields the server (host_spec(), client_key_pem)."""
    from testbed.servers.sshd import LocalSshd

    with LocalSshd() as srv:
        yield srv


@pytest.fixture
def conn(local_sshd):
    """A fresh SSH connection to the local sshd with its key (no connection cached from an earlier test)."""
    from access import keys, ssh

    keys.set_private_key("sshPrivateKey", local_sshd.client_key_pem)
    ssh.close_all()
    c = ssh.connect(local_sshd.host_spec())
    yield c
    ssh.close_all()


@pytest.fixture
def provider_server_for(local_sshd):
    """Factory: a gRPC dynamic-provider server configured with the local sshd's key as secret config."""
    from testbed.provider_server import ProviderServer

    servers = []

    def make(extra_config=None):
        srv = ProviderServer({"gpuhost:sshPrivateKey": local_sshd.client_key_pem, **(extra_config or {})})
        servers.append(srv.__enter__())
        return srv

    yield make
    for s in servers:
        s.__exit__(None, None, None)


_MEASURED: list[str] = []


@pytest.fixture
def measured(request):
    """``measured(line)``: a figure a test measured, printed in the run's summary (CI log) under "measured"."""
    return lambda line: _MEASURED.append(f"{request.node.nodeid}: {line}")


def pytest_terminal_summary(terminalreporter):
    if _MEASURED:
        terminalreporter.section("measured")
        for line in _MEASURED:
            terminalreporter.write_line(line)
