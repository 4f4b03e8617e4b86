"""SystemPackages: a Debian/RHEL package set installed. (ServiceState, a systemd unit gpuhost does not write kept
enabled and running, is the one systemd provider's, providers.systemd_service; importable from here as before.)

SystemPackages installs what is missing (apt-get/dnf, non-interactive, keeping config files gpuhost wrote; from
`debs_dir`'s .deb files on a host without network). Which packages were missing is recorded on the host the first
time, so a re-run after a dropped connection does not take the packages it just installed for the host's own;
delete removes exactly those. Read reports the packages present, so a removed one is drift that `up` repairs.

Usage::

    SystemPackages("svc-nginx-pkg", {"host": host_input(spec), "packages": ["nginx", "numactl"]})
"""

from __future__ import annotations

import re
from typing import Optional

from pulumi.dynamic import CheckFailure

from access.shell import Script, quote
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider, is_safe_abs_path
from providers.systemd_service import ServiceState

__all__ = ["ServiceState", "SystemPackages", "SystemPackagesProvider"]  # ServiceState lives with its provider

PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.\-]+$")


def missing_script(packages: list[str]) -> str:
    """Prints each package of `packages` that is not installed."""
    s = Script()
    for p in packages:
        s.raw(
            f"if command -v dpkg-query >/dev/null 2>&1; then dpkg-query -W -f '${{db:Status-Status}}' {quote(p)} "
            f"2>/dev/null | grep -qx installed || echo {quote(p)}; else rpm -q {quote(p)} >/dev/null 2>&1 || "
            f"echo {quote(p)}; fi"
        )
    return s.render()


def install_line(packages: list[str], debs_dir: Optional[str] = None) -> str:
    """apt-get (or dnf) install of ``packages``; on an offline host, every .deb file in ``debs_dir``."""
    apt = (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold "
    )
    if debs_dir:
        # The directory is the package set: the packages and the dependencies the host lacks, all installed.
        return apt + f"{quote(debs_dir)}/*.deb"
    names = " ".join(quote(p) for p in packages)
    return f"if command -v apt-get >/dev/null 2>&1; then {apt}{names}; else dnf install -y {names}; fi"


def remove_line(packages: list[str]) -> str:
    names = " ".join(quote(p) for p in packages)
    return (
        f"if command -v apt-get >/dev/null 2>&1; then DEBIAN_FRONTEND=noninteractive apt-get remove -y {names}; "
        f"else dnf remove -y {names}; fi"
    )


class SystemPackagesProvider(TemplateProvider):
    VERSION = "2"  # 2: on the template; what was missing is recorded on the host
    KIND = "packages"
    INPUTS = ("host", "packages", "debs_dir")
    OUTPUT_ONLY = ("installed",)

    def validate(self, news: dict) -> list[CheckFailure]:
        failures = []
        pkgs = news.get("packages")
        if not isinstance(pkgs, list) or not pkgs:
            failures.append(CheckFailure("packages", "a list of package names"))
        else:
            failures += [
                CheckFailure("packages", f"not a package name: {p!r}")
                for p in pkgs
                if not (isinstance(p, str) and PACKAGE_RE.match(p))
            ]
        if news.get("debs_dir") is not None and not is_safe_abs_path(news["debs_dir"]):
            failures.append(CheckFailure("debs_dir", "an absolute path without '..'"))
        return failures

    def _record(self, props: dict) -> Record:
        return Record(self.owner(props), values={f"package/{p}": missing_script([p]) for p in props["packages"]})

    def _missing(self, conn, packages: list[str]) -> list[str]:
        return conn.run(missing_script(packages)).stdout.split()

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        _, _, first = self.record_and_read(conn, props, self._record(props), "")
        ours = {p for p in props["packages"] if first.get(f"package/{p}")}
        missing = self._missing(conn, list(props["packages"]))
        if missing:
            ch = Change(self.owner(props)).add([install_line(missing, props.get("debs_dir"))])
            self.guarded(conn, "installing " + " ".join(missing), lambda: ch.run(conn), changing=True)
        return {"installed": sorted(ours | set((prior or {}).get("installed") or []))}

    def observe(self, props: dict) -> dict:
        missing = set(self._missing(self.conn(props), list(props["packages"])))
        return {"packages": [p for p in props["packages"] if p not in missing]}

    def restore(self, props: dict) -> Change:
        ours = list(props.get("installed") or [])
        return Change(self.owner(props)).add([remove_line(ours)] if ours else []).forget(self._record(props))


class SystemPackages(HostResource, module="host", name="SystemPackages"):
    PROVIDER = SystemPackagesProvider
    DEFAULTS = {"debs_dir": None}
