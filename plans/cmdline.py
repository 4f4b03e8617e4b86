"""Kernel command line: which arguments to add/remove, the new /etc/default/grub, and pending-reboot state.

Pure. Usage::

    new_text = edit_grub_default(old_text, add=["intel_iommu=on", "iommu=pt"], remove=["nomodeset"])
    p = plan_cmdline(facts_cmdline, configured_value, want_add, want_remove)
    p.pending_reboot, p.sentence

Only `GRUB_CMDLINE_LINUX` is edited (seeds 000 §3.2 and 002 §3); every other line keeps its bytes. An argument is
matched by key (`hugepages=64` replaces `hugepages=16`), so re-running converges instead of stacking duplicates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from access.shell import sh
from facts.files import FileState
from plans.plan import Action, FileWrite, Plan, plan_of
from plans.values import param_name

GRUB = "/etc/default/grub"
VAR = "GRUB_CMDLINE_LINUX"
_LINE = re.compile(r"^(?P<indent>\s*)(?P<export>export\s+)?GRUB_CMDLINE_LINUX=(?P<value>.*)$")

# Arguments gpuhost refuses to add unless the stack explicitly acknowledges the risk (seeds 000/001/002 pitfalls).
UNSAFE = {
    "pcie_acs_override": "acs_override_acknowledged",
    "vfio_iommu_type1.allow_unsafe_interrupts": "allow_unsafe_interrupts_acknowledged",
    # No IOMMU at all: devices can DMA anywhere; as unsafe as (and acknowledged like) unsafe interrupts.
    "vfio.enable_unsafe_noiommu_mode": "allow_unsafe_interrupts_acknowledged",
}

# Parameters gpuhost sets itself (stacks.args.cmdline_args, the vfio binding, the hugepage and isolation fields):
# kernel.extra_args may set one only when kernel.overrides_acknowledged names it (its value then replaces gpuhost's).
# Names as `param_name` spells them; a name ending in '.' stands for every parameter of that module.
OWNED = {
    "intel_iommu": "cpu_vendor",
    "amd_iommu": "cpu_vendor",
    "iommu": "kernel.iommu_passthrough",
    "iommu.": "kernel.iommu_passthrough",
    "kvm.ignore_msrs": "kernel.kvm_ignore_msrs",
    "video": "kernel.video_efifb_off",
    "hugepages": "hugepages.count",
    "hugepagesz": "hugepages.size",
    "default_hugepagesz": "hugepages.size",
    "isolcpus": "kernel.isolate_vm_cpus and reserved_cpus",
    "nohz_full": "kernel.isolate_vm_cpus and reserved_cpus",
    "rcu_nocbs": "kernel.isolate_vm_cpus and reserved_cpus",
    "irqaffinity": "reserved_cpus and irq_pin",
    "vfio.": "gpus[] and bind",
    "vfio_pci.": "gpus[] and bind",
    "vfio_iommu_type1.": "gpus[] and bind",
}


def owned_by(name: str) -> str | None:
    """The config field through which gpuhost sets kernel parameter `name` (param_name spelling), or None."""
    if name in OWNED:
        return OWNED[name]
    mod = name.split(".", 1)[0] + "."
    return OWNED.get(mod) if "." in name else None


def key(arg: str) -> str:
    """The parameter's name as the kernel compares it (`-` and `_` alike), so `vfio-pci.ids=` replaces
    `vfio_pci.ids=` instead of stacking a second one."""
    return param_name(arg)


def parse_value(raw: str) -> list[str]:
    raw = raw.strip()
    if not raw:
        return []
    # The shell's view of the assignment (update-grub sources the file), then the kernel's: words split on blanks.
    return _sh_word(raw).split()


def _sh_word(raw: str) -> str:
    """The first word of `raw` as POSIX sh reads an assignment's value: '…' literal, "…" with \\ escaping only
    $ ` " \\ and newline (shlex gets that last rule wrong), unquoted \\x → x."""
    out, i, n = [], 0, len(raw)
    while i < n and not raw[i].isspace():
        c = raw[i]
        if c == "'":
            j = raw.find("'", i + 1)
            j = n if j < 0 else j
            out.append(raw[i + 1 : j])
            i = j + 1
        elif c == '"':
            i += 1
            while i < n and raw[i] != '"':
                if raw[i] == "\\" and i + 1 < n and raw[i + 1] in '$`"\\\n':
                    out.append(raw[i + 1])
                    i += 2
                else:
                    out.append(raw[i])
                    i += 1
            i += 1
        elif c == "\\" and i + 1 < n:
            out.append(raw[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def apply_args(current: list[str], add: list[str], remove: list[str]) -> list[str]:
    """Remove by key (or exact arg), then add/replace by key, keeping the order of what stays."""
    remove_keys = {key(r) for r in remove if "=" not in r}
    remove_exact = {r for r in remove if "=" in r}
    out = [a for a in current if key(a) not in remove_keys and a not in remove_exact]
    for a in add:
        idx = next((i for i, x in enumerate(out) if key(x) == key(a)), None)
        if idx is None:
            out.append(a)
        else:
            out[idx] = a
    return out


def _dq_escape(s: str) -> str:
    """Escape for a double-quoted shell string: /etc/default/grub is *sourced* by update-grub/grub2-mkconfig, so $
    and backticks would expand (second line of defence; `plans.values.kernel_arg` refuses them first)."""
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")


def find_value(text: str) -> tuple[list[str], bool]:
    """(arguments of the last GRUB_CMDLINE_LINUX= line, whether the line exists)."""
    found, args = False, []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            found, args = True, parse_value(m.group("value"))
    return args, found


def edit_grub_default(text: str, add: list[str], remove: list[str]) -> str:
    args, found = find_value(text)
    new_args = apply_args(args, add, remove)
    new_line_value = '"' + _dq_escape(" ".join(new_args)) + '"'
    if not found:
        sep = "" if text.endswith("\n") or not text else "\n"
        return f"{text}{sep}{VAR}={new_line_value}\n"
    lines = text.splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if _LINE.match(line.rstrip("\n")))
    if new_args == args:
        return text
    m = _LINE.match(lines[last].rstrip("\n"))
    assert m is not None  # `last` is a line _LINE matched
    end = "\n" if lines[last].endswith("\n") else ""
    lines[last] = f"{m.group('indent')}{m.group('export') or ''}{VAR}={new_line_value}{end}"
    return "".join(lines)


@dataclass
class CmdlinePlan:
    configured: list[str]
    running: list[str]
    add: list[str]
    remove: list[str]
    file_change: bool
    missing_running: list[str] = field(default_factory=list)
    stale_running: list[str] = field(default_factory=list)

    @property
    def pending_reboot(self) -> bool:
        return bool(self.missing_running or self.stale_running)

    @property
    def sentence(self) -> str:
        parts = []
        if self.file_change:
            parts.append(f"set {VAR} to {' '.join(self.configured)!r} and regenerate the GRUB config")
        if self.pending_reboot:
            why = []
            if self.missing_running:
                why.append("not yet running: " + " ".join(self.missing_running))
            if self.stale_running:
                why.append("still running: " + " ".join(self.stale_running))
            parts.append("reboot needed (" + "; ".join(why) + ")")
        return "; ".join(parts) or "kernel command line already as wanted (configured and running)"


def plan_cmdline(grub_text: str, running: list[str], add: list[str], remove: list[str]) -> CmdlinePlan:
    current, _ = find_value(grub_text)
    wanted = apply_args(current, add, remove)
    missing = [a for a in add if a not in running]
    remove_keys = {key(r) for r in remove if "=" not in r}
    stale = [a for a in running if key(a) in remove_keys or a in remove]
    return CmdlinePlan(
        configured=wanted,
        running=running,
        add=add,
        remove=remove,
        file_change=edit_grub_default(grub_text, add, remove) != grub_text,
        missing_running=missing,
        stale_running=stale,
    )


def unsafe_args(args: list[str], acknowledged: set[str]) -> list[str]:
    """Errors for risky arguments the stack did not explicitly acknowledge."""
    errs = []
    for a in args:
        flag = UNSAFE.get(param_name(a))
        if flag and flag not in acknowledged:
            errs.append(
                f"{a!r} weakens isolation between devices/VMs (seeds warn: last resort only); "
                f"set {flag}: true on the host to use it"
            )
    return errs


def regenerate_commands(family: str) -> list[list[str]]:
    """The commands that turn /etc/default/grub into the boot config (seed 000 §3.2, seed 002 §3)."""
    if family == "debian":
        return [["update-grub"]]
    if family == "rhel":
        return [["grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"]]
    raise ValueError(f"unsupported OS family {family!r}")


def grubby_commands(add: list[str], remove: list[str]) -> list[list[str]]:
    """RHEL's BLS entries carry their own args: grubby updates every installed kernel too."""
    cmds = []
    if add:
        cmds.append(["grubby", "--update-kernel=ALL", "--args=" + " ".join(add)])
    if remove:
        cmds.append(["grubby", "--update-kernel=ALL", "--remove-args=" + " ".join(remove)])
    return cmds


def regenerate_lines(family: str, add: list[str], remove: list[str]) -> list[str]:
    """Shell lines regenerating the boot config (and, on RHEL, every installed kernel's BLS args)."""
    cmds = regenerate_commands(family) + (grubby_commands(add, remove) if family == "rhel" else [])
    return [
        sh(*c) + " >/dev/null 2>&1 || { echo 'regenerating the boot config failed' >&2; exit 1; }"
        if c[0] in ("update-grub", "grub2-mkconfig")
        else sh(*c)
        for c in cmds
    ]


def boot_plan(cp: CmdlinePlan, grub: FileState, family: str) -> Plan:
    """The actions for `cp` on a host whose /etc/default/grub is `grub`: rewrite it (mode and owner kept) and
    regenerate the boot config, or nothing."""
    if not cp.file_change:
        return plan_of([], cp.sentence)
    new = edit_grub_default(grub.text, cp.add, cp.remove).encode()
    write = FileWrite(GRUB, new, (grub.mode or "644").zfill(4), f"{grub.uid}:{grub.gid}")
    return plan_of(
        [
            Action(f"set {VAR} to {' '.join(cp.configured)!r} in {GRUB}", write=write),
            *[Action("regenerate the boot config", line) for line in regenerate_lines(family, cp.add, cp.remove)],
        ],
        cp.sentence,
    )
