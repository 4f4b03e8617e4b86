"""Pytest plugin: the emulated GPU server as fixtures (listed in tests/conftest.py's pytest_plugins).

Usage::

    import pytest

    @pytest.mark.testhost
    def test_cmdline(testhost):                       # a fresh, booted host for this module
        assert "root=UUID=" in testhost.ssh("cat /proc/cmdline").stdout

Fixtures:
    testhost_image   (session) the cached base image; built on first use (a few minutes), skipped only when
                     qemu-system-x86_64 is not installed.
    testhost_key     (session) the per-run client key, authorized in each guest at boot via fw_cfg.
    testhost         (module)  a fresh copy-on-write overlay, booted: Debian as installed, IOMMU device present,
                     GRUB_CMDLINE_LINUX empty.
    testhost_iommu   (module)  a host with IOMMU groups. Debian 12's kernel is built with
                     CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF=y, so DMA remapping is on without intel_iommu=on:
                     this is the same host as `testhost` (no extra base overlay or reboot is needed).
    testhost_noiommu (module)  the same machine without the intel-iommu device (VT-d off in firmware).

When a test using one of these fails, the report gets a "testhost" section naming the serial console log.
"""

from __future__ import annotations

import pytest

from tests.testhost.machine import SshKey, TestHost, qemu_available

HOST_FIXTURES = ("testhost", "testhost_iommu", "testhost_noiommu")
_BOOTED: list[TestHost] = []


def pytest_configure(config):
    config.addinivalue_line("markers", "testhost: boots the emulated QEMU GPU server (tests/testhost; slow)")


@pytest.fixture(scope="session")
def testhost_image():
    if not qemu_available():
        pytest.skip("qemu-system-x86_64 is not installed: the emulated GPU server cannot boot")
    from tests.testhost.image import ensure_image

    return ensure_image()


@pytest.fixture(scope="session")
def testhost_key(tmp_path_factory):
    return SshKey.generate(tmp_path_factory.mktemp("testhost-key"))


def _boot(request, image, key, tmp_path_factory, kind: str, **kw):
    name = f"{kind}-{request.module.__name__.rsplit('.', 1)[-1]}"
    host = TestHost(image, tmp_path_factory.mktemp(name), key, name=name, **kw)
    try:
        host.start()
    except BaseException:
        host.stop()
        raise
    _BOOTED.append(host)
    return host


@pytest.fixture(scope="module")
def testhost(request, testhost_image, testhost_key, tmp_path_factory):
    host = _boot(request, testhost_image, testhost_key, tmp_path_factory, "testhost")
    yield host
    host.stop()


@pytest.fixture(scope="module")
def testhost_iommu(testhost):
    return testhost


@pytest.fixture(scope="module")
def testhost_noiommu(request, testhost_image, testhost_key, tmp_path_factory):
    host = _boot(request, testhost_image, testhost_key, tmp_path_factory, "noiommu", iommu=False)
    yield host
    host.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    for name in HOST_FIXTURES:
        host = getattr(item, "funcargs", {}).get(name)
        if isinstance(host, TestHost):
            rep.sections.append(
                (
                    f"testhost {host.name}",
                    f"serial console log: {host.serial_log}\nQEMU: {host.workdir / 'qemu.cmdline'}",
                )
            )


def pytest_terminal_summary(terminalreporter):
    if not _BOOTED:
        return
    terminalreporter.section("emulated GPU servers (tests/testhost)")
    for h in _BOOTED:
        terminalreporter.write_line(f"{h.name}: {h.timings}  reboots={h.reboots}  serial log: {h.serial_log}")
