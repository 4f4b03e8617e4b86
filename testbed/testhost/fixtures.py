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
    testhost         (session) one copy-on-write overlay, booted once for every emulated-server test: Debian as
                     installed, IOMMU device present, GRUB_CMDLINE_LINUX empty. Shared, so every test (or its
                     module's fixture) leaves the host as it found it: gpuhost's providers restore by design
                     (destroy), hand-made changes are undone by the test. `kernel_starts()` counts kernel starts
                     on the serial console, so "exactly one reboot" is a difference, not an absolute count.
    testhost_iommu   (session) a host with IOMMU groups. Debian 12's kernel is built with
                     CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF=y, so DMA remapping is on without intel_iommu=on:
                     this is the same host as `testhost` (no extra base overlay or reboot is needed).
    testhost_noiommu (session) the same machine without the intel-iommu device (VT-d off in firmware); stopped
                     right after the last test that asks for it, so an idle TCG guest does not eat the CI's CPU.
    testhost_overlay (function) factory for a *fresh* extra host (own overlay of the same image), only for tests that
                     truly need one more machine (two-host rollouts); stopped at the end of the test.

One boot per kind per session: under TCG a boot costs ~2 minutes of a 2-core CI machine, and each module booting
its own host was the largest item of the CI budget.

When a test using one of these fails, the report gets a "testhost" section naming the serial console log.
"""

from __future__ import annotations

import pytest

from testbed.testhost.machine import SshKey, TestHost, qemu_available

HOST_FIXTURES = ("testhost", "testhost_iommu", "testhost_noiommu")
_BOOTED: list[TestHost] = []


def pytest_configure(config):
    config.addinivalue_line("markers", "testhost: boots the emulated QEMU GPU server (testbed/testhost; slow)")


@pytest.fixture(scope="session")
def testhost_image():
    if not qemu_available():
        pytest.skip("qemu-system-x86_64 is not installed: the emulated GPU server cannot boot")
    from testbed.testhost.image import ensure_image

    return ensure_image()


@pytest.fixture(scope="session")
def testhost_key(tmp_path_factory):
    return SshKey.generate(tmp_path_factory.mktemp("testhost-key"))


def _boot(image, key, tmp_path_factory, name: str, **kw):
    host = TestHost(image, tmp_path_factory.mktemp(name), key, name=name, **kw)
    try:
        host.start()
    except BaseException:
        host.stop()
        raise
    _BOOTED.append(host)
    return host


@pytest.fixture(scope="session")
def testhost(testhost_image, testhost_key, tmp_path_factory):
    host = _boot(testhost_image, testhost_key, tmp_path_factory, "testhost")
    yield host
    host.stop()


@pytest.fixture(scope="session")
def testhost_iommu(testhost):
    return testhost


@pytest.fixture(scope="session")
def testhost_noiommu(testhost_image, testhost_key, tmp_path_factory):
    host = _boot(testhost_image, testhost_key, tmp_path_factory, "noiommu", iommu=False)
    yield host
    host.stop()


@pytest.fixture
def testhost_overlay(testhost_image, testhost_key, tmp_path_factory):
    """Factory: `testhost_overlay("b")` boots one more fresh host (own overlay); all are stopped after the test."""
    hosts: list[TestHost] = []

    def make(name: str, **kw) -> TestHost:
        host = _boot(testhost_image, testhost_key, tmp_path_factory, name, **kw)
        hosts.append(host)
        return host

    yield make
    for h in hosts:
        h.stop()


def kernel_starts(host: TestHost) -> int:
    """Kernel starts seen on the host's serial console since it was started (the first boot counts)."""
    return host.serial_log.read_text(errors="replace").count("Linux version")


# Session hosts are stopped right after the last test that uses them (an idle TCG guest still costs CPU).
_LAST_USER: dict[str, str] = {}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    # The few no-IOMMU tests run together at the end, so that host is up for minutes, not for the whole session.
    noiommu = [it for it in items if "testhost_noiommu" in getattr(it, "fixturenames", ())]
    if noiommu:
        items[:] = [it for it in items if it not in noiommu] + noiommu
    _LAST_USER.clear()
    for it in items:
        for name in ("testhost", "testhost_noiommu"):
            if name in getattr(it, "fixturenames", ()):
                _LAST_USER[name] = it.nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    for name, nodeid in _LAST_USER.items():
        host = getattr(item, "funcargs", {}).get(name)
        if item.nodeid == nodeid and isinstance(host, TestHost):
            host.stop()  # idempotent: the session fixture's own stop() later does nothing


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
    terminalreporter.section("emulated GPU servers (testbed/testhost)")
    for h in _BOOTED:
        terminalreporter.write_line(f"{h.name}: {h.timings}  reboots={h.reboots}  serial log: {h.serial_log}")
