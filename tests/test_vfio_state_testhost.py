"""VfioBinding survives a dropped connection, on the emulated GPU server (the case tests/test_state_testhost.py
leaves out: it waited for update-initramfs, which this host's binding no longer runs, see plans/vfio.py).

The host drops every SSH session after the binding's change ran (files written, GPU and audio function bound to
vfio-pci live through driverctl) and before its result came back. The re-run is a create reading a host that is
already bound: the priors it reports are the pristine drivers (recorded on the host at the first read), not
vfio-pci; destroy then puts every file and both drivers back as the pristine host had them, live (driverctl
unset-override rebinds; no reboot), and the initramfs was never rebuilt.
"""

from __future__ import annotations

import pytest

from providers.vfio import BLACKLIST, MODPROBE_VFIO, MODULES_LOAD, VfioBindingProvider, driverctl_file
from testbed.provider_server import ProviderError, ProviderServer
from tests.dropharness import assert_no_records, drop_first_apply, undo
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
        # facts + the initramfs listing + driverctl, under TCG
        changed, errors = drop_first_apply(th, r, inputs, observe=lambda: snapshot(th), wait_s=480, hold="sleep 300")
        th.ssh("rm -f /usr/local/sbin/date")
        assert changed["runtime"][:2] == ["vfio-pci", "vfio-pci"], "the drop must land after the binding"
        assert changed["runtime"][2:] == pristine["runtime"][2:]  # the initramfs was not rebuilt
        assert isinstance(errors[0], ProviderError) and th.name in errors[0].details

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
        assert_no_records(th, "test/vfio")
    finally:
        undo(th, r, srv)
