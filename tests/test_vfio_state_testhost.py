"""VfioBinding survives a dropped connection, on the emulated GPU server (the case tests/test_state_testhost.py
leaves out: it waited for update-initramfs, which this host's binding no longer runs, see plans/vfio.py).

The host drops every SSH session after the binding's change ran (files written, GPU and audio function bound to
vfio-pci live through driverctl) and before its result came back. The re-run is a create reading a host that is
already bound: the priors it reports are the pristine drivers (recorded on the host at the first read), not
vfio-pci; destroy then puts every file and both drivers back as the pristine host had them, live (driverctl
unset-override rebinds; no reboot), and the initramfs was never rebuilt.
"""

from __future__ import annotations

import threading
import time

import pytest

from providers.vfio import BLACKLIST, MODPROBE_VFIO, MODULES_LOAD, VfioBindingProvider, driverctl_file
from tests.engine import ProviderError, ProviderServer
from tests.test_state_testhost import SLOW_DATE

pytestmark = pytest.mark.testhost

GPU, AUDIO = "0000:81:00.0", "0000:81:00.1"
PATHS = [MODULES_LOAD, MODPROBE_VFIO, BLACKLIST, driverctl_file(GPU), driverctl_file(AUDIO)]
# The same hook as tests/test_state_testhost.py's, holding the epilogue longer: on a loaded 2-core machine the
# test's own SSH calls between the hold and the drop take tens of seconds under TCG.
HOLD = SLOW_DATE.replace("sleep 90", "sleep 300")
assert HOLD != SLOW_DATE
RUNTIME = (
    f"for d in {GPU} {AUDIO}; do basename $(readlink /sys/bus/pci/devices/$d/driver) 2>/dev/null || echo none; done; "
    "sha256sum /boot/initrd.img-*"
)


def snapshot(th) -> dict:
    """Type, mode, owner and sha256 of every path (or absence), and the runtime values: one SSH call."""
    out = th.ssh(
        "for p in "
        + " ".join(PATHS)
        + '; do if [ -e "$p" ] || [ -L "$p" ]; then echo "$p $(stat -c \'%F %a %u %g\' "$p") '
        + '$(sha256sum < "$p" | cut -c1-64)"; else echo "$p ABSENT"; fi; done; echo @@runtime; '
        + RUNTIME
    ).stdout
    files, runtime = out.split("@@runtime\n", 1)
    return {"files": files.splitlines(), "runtime": runtime.split()}


def test_vfio_drop_after_the_write_then_rerun_then_destroy_restores_the_pristine_host(testhost):
    th = testhost
    pristine = snapshot(th)
    assert pristine["runtime"][:2] != ["vfio-pci", "vfio-pci"], pristine
    inputs = {
        "host": th.host_spec().model_dump(mode="json"),
        "devices": [GPU],
        "mode": "address",
        "blacklist_nouveau": True,
        "disable_vga": True,
        "owner_tag": "test/vfio",
        "version": VfioBindingProvider.VERSION,
    }
    srv = ProviderServer({f"gpuhost:{th.key_name}": th.private_key_pem}).__enter__()
    r = srv.resource(VfioBindingProvider(), "gpuhost:host:VfioBinding", "drop-vfio")
    try:
        th.ssh("cat > /usr/local/sbin/date && chmod +x /usr/local/sbin/date", input=HOLD)
        th.ssh("rm -f /run/gpuhost-drop-now; touch /run/gpuhost-drop-armed")
        errors: list[BaseException] = []

        def first_apply():
            try:
                r.up(inputs)
            except BaseException as e:  # noqa: BLE001 - handed to the test thread
                errors.append(e)

        t = threading.Thread(target=first_apply)
        t.start()
        deadline = time.monotonic() + 480  # facts + the initramfs listing + driverctl, under TCG
        while th.ssh("test -e /run/gpuhost-drop-now", check=False).rc != 0:
            assert time.monotonic() < deadline and t.is_alive(), f"the change never reached its epilogue: {errors}"
            time.sleep(0.3)
        changed = snapshot(th)
        th.ssh("nohup sh -c 'sleep 0.2; pkill -KILL -f \"sshd: gpuadmin\"' >/dev/null 2>&1 &", check=False)
        t.join()
        th.wait_ssh(120)
        # the held epilogue, if the drop left it running, lets go of the host lock now
        th.ssh(
            "pkill -f '^sleep 300$' || true; rm -f /usr/local/sbin/date /run/gpuhost-drop-armed /run/gpuhost-drop-now"
        )

        assert changed["runtime"][:2] == ["vfio-pci", "vfio-pci"], "the drop must land after the binding"
        assert changed["runtime"][2:] == pristine["runtime"][2:]  # the initramfs was not rebuilt
        assert errors and isinstance(errors[0], ProviderError), errors
        assert th.name in errors[0].details and r.id is None  # no state: the re-run is a create

        op, outs = r.up(inputs)
        assert op == "create"
        # The priors are the pristine host's drivers, not the vfio-pci the dropped run had already bound.
        assert [outs["prior_drivers"][a] for a in (GPU, AUDIO)] == pristine["runtime"][:2], outs
        # no driverctl override before gpuhost (null values do not survive the engine's struct: absent or None)
        assert not any((outs.get("prior_overrides") or {}).values()), outs
        assert outs["drivers"] == {GPU: "vfio-pci", AUDIO: "vfio-pci"} and outs["pending_reboot"] is False
        assert "no initramfs rebuild" in outs["initramfs"], outs["initramfs"]
        assert snapshot(th) == changed
        r.destroy()
        assert snapshot(th) == pristine
        left = th.ssh("grep -rl 'test/vfio' /var/lib/gpuhost/pristine 2>/dev/null || true").stdout
        assert left.strip() == "", left
    finally:
        if r.id is not None:  # a failed assertion must not leave the shared host changed for the next tests
            r.destroy()
        th.ssh("rm -f /usr/local/sbin/date /run/gpuhost-drop-armed /run/gpuhost-drop-now", check=False)
        srv.__exit__(None, None, None)
