"""What a config value may contain before it lands in a file some tool parses or sources, or in a command.

Pure allow-lists (not deny-lists): each checker returns the value (normalised where the kernel or a tool
normalises it) or raises ValueError with a sentence that says what is allowed. The stack loader runs them on every
field (first line of defence, with the config path); providers run the same checkers in `check` (second line), and
writers still escape what they write (third).

Why allow-lists: `/etc/default/grub` is *sourced* by update-grub and grub2-mkconfig, so `x=$(id)` in a kernel
argument runs as root; modprobe.d, sysctl.d, systemd units and tuned each parse their own quoting. A character set
that none of them treats specially is simpler to get right than an escaper per format.

Usage::

    kernel_arg("isolcpus=2-7,34-39")          # -> "isolcpus=2-7,34-39"
    kernel_arg("x=$(id)")                      # ValueError: ... may hold only ...
    param_name("vfio-iommu-type1.allow-unsafe-interrupts")  # -> "vfio_iommu_type1.allow_unsafe_interrupts"
    url_host("fd00::11")                       # -> "[fd00::11]"
"""

from __future__ import annotations

import ipaddress
import re

from plans import mig

# Kernel command-line words: what real arguments use (isolcpus=2-7,34-39, video=efifb:off, console=ttyS0,115200n8,
# root=UUID=..., vfio-pci.ids=10de:2684, rd.lvm.lv=vg/root). No quotes, spaces, $, backticks, ;, |, &, \, <, >.
KERNEL_ARG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.,:/=+@%-]*$")
KERNEL_ARG_CHARS = "letters, digits and _ . , : / = + @ % - (no spaces, quotes, $, backticks or shell characters)"
SYSCTL_NAME_RE = re.compile(r"^[a-z0-9_]+(\.[A-Za-z0-9_-]+)+$")
SYSCTL_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:/+-]+( [A-Za-z0-9_.,:/+-]+)*$")
PROFILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
GOVERNOR_RE = re.compile(r"^[a-z][a-z_]{0,31}$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
    r"[A-Za-z0-9])?)*$"
)
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
PATH_RE = re.compile(r"^(/[A-Za-z0-9_.+-]+)+/?$")
IMAGE_RE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]{1,5})?(/[a-z0-9]+([._-]{1,2}[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
CONFIG_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
GPU_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$")


def _one_line(v: object, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a string, not {type(v).__name__}")
    if "\x00" in v or "\n" in v or "\r" in v:
        raise ValueError(f"{what} {v!r} holds a NUL or line break")
    return v


def _match(v: object, rx: re.Pattern, what: str, allowed: str) -> str:
    s = _one_line(v, what)
    if not rx.fullmatch(s):  # fullmatch: `match` with `$` lets a trailing newline through
        raise ValueError(f"{what} {s!r} may hold only {allowed}")
    return s


def kernel_arg(v: object) -> str:
    """A kernel command-line word (lands in GRUB_CMDLINE_LINUX, which update-grub sources, and in grubby --args)."""
    return _match(v, KERNEL_ARG_RE, "kernel argument", KERNEL_ARG_CHARS)


def param_name(arg: str) -> str:
    """The kernel's own spelling of a parameter name: `-` and `_` are the same character in names (not values).

    `vfio-iommu-type1.allow-unsafe-interrupts=1` and `vfio_iommu_type1.allow_unsafe_interrupts=1` set one parameter;
    kernel/params.c compares names with `dash2underscore`, so every name comparison in gpuhost goes through this.
    """
    return arg.split("=", 1)[0].replace("-", "_")


def sysctl_name(v: object) -> str:
    s = _match(v, SYSCTL_NAME_RE, "sysctl name", "dotted names like net.core.somaxconn (letters, digits, _ and -)")
    return s


def sysctl_value(v: object) -> str:
    s = " ".join(
        _one_line(str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v, "sysctl value").split()
    )
    if not SYSCTL_VALUE_RE.fullmatch(s):
        raise ValueError(f"sysctl value {s!r} may hold only letters, digits, spaces and _ . , : / + -")
    return s


def tuned_profile(v: object) -> str:
    return _match(
        v, PROFILE_RE, "tuned profile", "one profile name: letters, digits, _ . - (as `tuned-adm list` shows)"
    )


def governor(v: object) -> str:
    return _match(v, GOVERNOR_RE, "CPU governor", "a cpufreq governor name (performance, powersave, schedutil ...)")


def unix_user(v: object) -> str:
    return _match(
        v,
        USER_RE,
        "user name",
        "a POSIX login name: lower-case letters, digits, _ and -, starting with a letter or _ (at most 32)",
    )


def dns_label(v: object, what: str = "name") -> str:
    return _match(
        v,
        DNS_LABEL_RE,
        what,
        "lower-case letters, digits and '-' (a DNS label, at most 63, no leading or trailing '-')",
    )


def address(v: object) -> str:
    """An IPv4/IPv6 address (stored without brackets, normalised) or a DNS host name."""
    s = _one_line(v, "address").strip()
    inner = s[1:-1] if s.startswith("[") and s.endswith("]") else s
    try:
        ip = str(ipaddress.ip_address(inner))
    except ValueError:
        ip = ""
    if ip and "%" not in ip:  # a zone (fe80::1%eth0) means nothing on the machine that dials it
        return ip
    if HOSTNAME_RE.fullmatch(s) and not re.fullmatch(r"[0-9.]+", s):
        return s.lower()
    raise ValueError(f"address {s!r} is neither an IP address nor a DNS host name (letters, digits, '-' and '.')")


def ip_address(v: object, what: str = "address") -> str:
    """An IP address only (a gateway, a DNS server, a static guest address), normalised; no zone (fe80::1%eth0:
    a zone names an interface of the machine that writes it), no brackets, no host name."""
    s = _one_line(v, what)
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:
        ip = None
    if ip is None or "%" in s:
        raise ValueError(f"{what} {s!r} is not an IP address (e.g. 10.20.1.1 or fd00::1, without a %zone)")
    return str(ip)


# Query parameters that carry a credential (presigned S3/GCS/Azure URLs, API tokens): never in plain config.
SECRET_PARAM_RE = re.compile(
    r"(x-amz-(signature|credential|security-token)|x-goog-(signature|credential)|sig|signature|"
    r"[a-z_-]*(token|secret|password|passwd|pwd|apikey|api_key|api-key|access_key|access-key|auth|credential)s?"
    r"[a-z_-]*|key)",
    re.IGNORECASE,
)


def secret_param(name: str) -> bool:
    """Whether a URL query parameter's name says it carries a credential (token, signature, password, key ...)."""
    return bool(SECRET_PARAM_RE.fullmatch(name.strip()))


def is_ipv6(addr: str) -> bool:
    if ":" not in addr:  # every IPv6 text has one; an IPv4 address or a name is settled without parsing it
        return False
    try:
        return isinstance(ipaddress.ip_address(addr.strip("[]")), ipaddress.IPv6Address)
    except ValueError:
        return False


def url_host(addr: str) -> str:
    """The host part of a URL or a host:port scrape target: IPv6 addresses in brackets (RFC 3986)."""
    return f"[{addr.strip('[]')}]" if is_ipv6(addr) else addr


def host_port(addr: str, port: int) -> str:
    return f"{url_host(addr)}:{int(port)}"


def model_name(v: object) -> str:
    s = _match(
        v, MODEL_NAME_RE, "model name", "letters, digits, _ . - (it is a directory of the model repository, at most 64)"
    )
    if set(s) == {"."}:
        raise ValueError(f"model name {s!r} is not a directory name")
    return s


def abs_path(v: object, what: str = "path") -> str:
    s = _match(v, PATH_RE, what, "an absolute path of letters, digits, _ . + - and /")
    if any(part in (".", "..") for part in s.split("/")):
        raise ValueError(f"{what} {s!r} may not contain . or .. components")
    return s


def image_ref(v: object) -> str:
    return _match(
        v,
        IMAGE_RE,
        "image",
        "a Docker reference like nvcr.io/nvidia/tritonserver:24.05-py3 (registry/name:tag[@sha256:...])",
    )


def mig_profile(v: object) -> str:
    return _match(
        v,
        mig.PROFILE_RE,
        "MIG profile",
        "a profile name as `nvidia-smi mig -lgip` prints it, e.g. 3g.40gb or 1g.10gb+me",
    )


def config_key(v: object) -> str:
    return _match(v, CONFIG_KEY_RE, "config key name", "letters, digits and _ (a Pulumi config key of gpuhost:)")


def gpu_model(v: object) -> str:
    return _match(v, GPU_MODEL_RE, "GPU model", "letters, digits, space, _ . -")


def irq_pattern(v: object) -> str:
    s = _one_line(v, "IRQ pattern")
    try:
        re.compile(s)
    except re.error as e:
        raise ValueError(f"IRQ pattern {s!r} is not a regular expression: {e}") from None
    return s
