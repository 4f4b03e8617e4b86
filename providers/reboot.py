"""HostReboot: at most one reboot per host per `up`, only when boot-time changes are not yet running; verified.

Every boot-time resource of a host (KernelCmdline, VfioBinding, ...) feeds this resource's inputs, so it runs
after all of them and sees their combined wish: the arguments that must be in /proc/cmdline, the arguments that
must not, the drivers each device must have. If the running host already matches, nothing happens (no reboot on a
no-op `up`). With policy "never" it reports what is pending instead. Never runs during preview (only create/update
reboot; check and diff do not touch the host).

Before rebooting, running libvirt domains are drained: `virsh shutdown` (ACPI, the guest shuts down cleanly), a
wait of up to `drain_timeout` seconds, `virsh destroy` only for what is still running then; after the verified
reboot the drained domains are started again (unless libvirt's autostart already did).

Inputs: host, policy ("auto" | "never"), expect_args, expect_absent, expect_drivers, drain_timeout, triggers,
timeout, version.
Outputs: pending (reasons, empty when the running host matches), rebooted, boot_id, drained (domains shut down for
the reboot and started again), forced (domains that had to be destroyed after the drain timeout).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access import ssh
from access.errors import HostError
from access.shell import sh
from facts.host import facts_script, parse_host_facts, read_host_facts
from facts.model import HostFacts
from plans.cmdline import key
from pristine import Change
from providers.base import HostResource, TemplateProvider
from providers.progress import resource_label, ticking

# Counted per process, for benchmarks (reboots per `up`).
REBOOTS: dict[str, int] = {}


def unmet(f: HostFacts, props: dict) -> list[str]:
    out = []
    for a in props.get("expect_args") or []:
        if a not in f.cmdline:
            out.append(f"kernel argument {a} not running")
    for a in props.get("expect_absent") or []:
        if any(x == a or ("=" not in a and key(x) == key(a)) for x in f.cmdline):
            out.append(f"kernel argument {a} still running")
    for addr, drv in (props.get("expect_drivers") or {}).items():
        d = f.pci.get(addr)
        have = d.driver if d else None
        if have != drv:
            out.append(f"{addr} uses {have or 'no driver'}, want {drv}")
    return out


def wait_for_new_boot(spec, old_boot_id: str, timeout: float) -> HostFacts:
    """Poll until the host runs a new boot that has finished starting its units, within `timeout` seconds in all
    (each connect and read is cut to the time left). A host-key mismatch is an answer, not a delay: it is raised at once, never retried."""
    # paramiko logs every refused banner while sshd is down; the loop below reports the outcome itself.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    time.sleep(min(3.0, timeout))
    while (left := deadline - time.monotonic()) > 0:
        ssh.drop(spec)
        try:
            short = spec.model_copy(update={"connect_timeout": max(0.5, min(spec.connect_timeout, left))})
            conn = ssh.connect(short, attempts=1)
            # The facts are read once the boot has finished (`is-system-running --wait`: running or degraded), so the
            # steps after the reboot meet a host whose units are up (libvirtd, tuned), not one still starting them.
            # The old boot, going down, answers at once ("stopping").
            wait = max(1, int(deadline - time.monotonic()) - 5)
            settle = f"timeout {wait} systemctl is-system-running --wait >/dev/null 2>&1 || true\n"
            out = conn.run(settle + facts_script(), timeout=max(0.5, deadline - time.monotonic())).stdout
            f = parse_host_facts(out)
            if f.boot_id and f.boot_id != old_boot_id:
                return f
        except (ssh.HostKeyMismatch, ssh.HostKeyUnknown):
            raise
        except (ssh.SshError, OSError, EOFError) as e:
            last = e
        time.sleep(min(3.0, max(0.0, deadline - time.monotonic())))
    raise ssh.HostUnreachable(
        f"{spec.name}: did not come back within {int(timeout)}s after reboot ({last}); "
        "check the console; re-run `pulumi up` once it is reachable"
    )


def running_domains(conn) -> list[str]:
    out = conn.run("command -v virsh >/dev/null 2>&1 && virsh list --state-running --name || true").stdout
    return [n for n in out.split() if n]


def drain(conn, timeout: float, label: str) -> tuple[list[str], list[str]]:
    """Shut running domains down gracefully; destroy what is still running after `timeout`. Returns (drained,
    forced). `label` names the resource in the progress lines of the wait (a guest that ignores ACPI holds it for
    the whole `timeout`)."""
    names = running_domains(conn)
    for n in names:
        conn.run(sh("virsh", "shutdown", n), check=False)
    deadline = time.monotonic() + timeout
    left = list(names)
    what = f"{', '.join(names)} on {conn.spec.name} to shut down for the reboot (then virsh destroy)"
    with ticking(label, what, timeout) if names else contextlib.nullcontext():
        while left and time.monotonic() < deadline:
            time.sleep(2)
            left = [n for n in running_domains(conn) if n in names]
    for n in left:
        conn.run(sh("virsh", "destroy", n), check=False)
    return names, left


def restart(conn, names: list[str], label: str, timeout: float = 120) -> None:
    """Start the drained domains again. libvirtd (socket-activated) starts autostart domains itself when the first
    client connects, possibly while we look: a failed `virsh start` counts only if the domain is still not running."""
    deadline = time.monotonic() + timeout
    left = [n for n in names if n not in set(running_domains(conn))]
    with ticking(label, f"{', '.join(names)} on {conn.spec.name} to run again after the reboot", timeout):
        while left:
            for n in left:
                conn.run(sh("virsh", "start", n), check=False)
            time.sleep(2)
            left = [n for n in names if n not in set(running_domains(conn))]
            if left and time.monotonic() > deadline:
                raise RuntimeError(f"domains drained for the reboot did not start again: {', '.join(left)}")


class HostRebootProvider(TemplateProvider):
    # 8: the drain and the restart of drained VMs say every 5 s what they wait for; 7: the reboot wait does
    # (providers.progress); 6: verified once the new boot has settled; 5: on the template; 4: the reboot wait keeps
    # its deadline and stops at a host-key mismatch
    VERSION = "8"
    KIND = "reboot"
    INPUTS = (
        "host",
        "policy",
        "expect_args",
        "expect_absent",
        "expect_drivers",
        "drain_timeout",
        "triggers",
        "timeout",
    )
    OUTPUT_ONLY = ("pending", "rebooted", "boot_id", "drained", "forced")

    def validate(self, news: dict) -> list[CheckFailure]:
        if news.get("policy", "auto") not in ("auto", "never"):
            return [CheckFailure("policy", "reboot policy must be 'auto' or 'never'")]
        return []

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        spec = self.spec(props)
        conn = ssh.connect(spec)
        f = self.guarded(conn, "reading the host", lambda: read_host_facts(conn))
        reasons = unmet(f, props)
        if not reasons or props.get("policy", "auto") == "never":
            return {"pending": reasons, "rebooted": False, "boot_id": f.boot_id, "drained": [], "forced": []}
        label = resource_label(props.get("owner_tag"), f"{spec.name}-reboot")
        drained, forced = drain(conn, float(props.get("drain_timeout") or 180), label)
        conn.run("nohup sh -c 'sleep 1; systemctl reboot' >/dev/null 2>&1 &")
        REBOOTS[spec.name] = REBOOTS.get(spec.name, 0) + 1
        bound = float(props.get("timeout") or 900)
        what = f"{spec.name} to come back from its reboot (a new boot id, units started)"
        with ticking(label, what, bound):
            f2 = wait_for_new_boot(spec, f.boot_id, bound)
        still = unmet(f2, props)
        if still:
            raise HostError(
                spec.name,
                "rebooted, but: " + "; ".join(still),
                fix="check GRUB regeneration, initramfs and `lspci -nnk` (seed 000 §3.4 pitfalls)",
                changed=True,
            )
        if drained:
            restart(ssh.connect(spec), drained, label)
        return {"pending": [], "rebooted": True, "boot_id": f2.boot_id, "drained": drained, "forced": forced}

    def diff_known(self, _id: str, olds: dict, news: dict):
        # After a refresh, `pending` says the running host no longer matches (a boot-time resource was re-applied
        # or someone rebooted into another entry): the next `up` must reboot/verify again.
        drifted = bool(olds.get("pending")) and news.get("policy", "auto") == "auto"
        return self.also_changed(super().diff_known(_id, olds, news), drifted)

    def observe(self, props: dict) -> dict:
        f = read_host_facts(self.conn(props))
        return {"pending": unmet(f, props), "boot_id": f.boot_id}

    def restore(self, props: dict) -> Change:
        # Nothing: restoring resources are deleted first; their effect on the running kernel waits for the next
        # reboot, which the operator schedules (KernelCmdline/VfioBinding report pending_reboot meanwhile).
        return Change(self.owner(props))


class HostReboot(HostResource, module="host", name="HostReboot"):
    pending: pulumi.Output[list]
    rebooted: pulumi.Output[bool]

    PROVIDER = HostRebootProvider
    DEFAULTS = {"policy": "auto"}
