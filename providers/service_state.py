"""SystemPackages and ServiceState: a Debian/RHEL package set installed, and a systemd unit checked, enabled and
(re)started or reloaded — nginx in front of Triton, Triton's own unit in the process runtime.

SystemPackages installs what is missing (apt-get/dnf, non-interactive, keeping config files gpuhost wrote; from
`debs_dir`'s .deb files on a host without network) and
remembers which it installed; delete removes exactly those. ServiceState runs `check` first (e.g. `nginx -t -c
/etc/nginx/nginx.conf` on the target: a bad config never reaches the running server), then `systemctl
daemon-reload`, `enable` and `restart` (or `reload` when the unit is already running and `action` is reload);
any change of `trigger` (a config's sha256, the repository digest) does it again. Delete puts the unit's enabled
and active states back as create found them. Read reports them, so a stopped server shows as drift.

Usage::

    SystemPackages("svc-nginx-pkg", {"host": host_input(spec), "packages": ["nginx", "numactl"]})
    ServiceState("svc-nginx", {"host": host_input(spec), "unit": "nginx", "action": "reload",
                 "check": ["nginx", "-t", "-c", "/etc/nginx/nginx.conf"], "trigger": conf.sha256})
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
from pulumi import dynamic
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult

from access.shell import Script, quote, sh
from providers.base import HostProvider


def missing_script(packages: list[str]) -> str:
    s = Script()
    for p in packages:
        s.raw(
            f"if command -v dpkg-query >/dev/null 2>&1; then dpkg-query -W -f '${{db:Status-Status}}' {quote(p)} "
            f"2>/dev/null | grep -qx installed || echo {quote(p)}; else rpm -q {quote(p)} >/dev/null 2>&1 || "
            f"echo {quote(p)}; fi"
        )
    return s.render()


def install_script(packages: list[str], debs_dir: Optional[str] = None) -> str:
    """apt-get (or dnf) install of ``packages``; on an offline host, every .deb file in ``debs_dir``."""
    s = Script().raw("set -e")
    if debs_dir:
        # The directory is the package set: the packages and the dependencies the host lacks, all installed.
        s.raw("export DEBIAN_FRONTEND=noninteractive")
        s.raw(f"apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold {quote(debs_dir)}/*.deb")
        return s.render()
    s.raw(
        "if command -v apt-get >/dev/null 2>&1; then export DEBIAN_FRONTEND=noninteractive; "
        "apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold "
        + " ".join(quote(p) for p in packages)
        + "; else dnf install -y "
        + " ".join(quote(p) for p in packages)
        + "; fi"
    )
    return s.render()


class SystemPackagesProvider(HostProvider):
    VERSION = "1"
    OUTPUT_ONLY = ("installed",)

    def _missing(self, conn, packages: list[str]) -> list[str]:
        return [x for x in conn.run(missing_script(packages)).stdout.split() if x]

    def _apply(self, props: dict, installed: list[str]) -> dict:
        conn = self.conn(props)
        missing = self._missing(conn, list(props["packages"]))
        if missing:
            conn.run(install_script(missing, props.get("debs_dir")))
        return self.outputs(props, installed=sorted(set(installed) | set(missing)))

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"{self.spec(props).name}:packages", self._apply(props, []))

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._apply(news, list(olds.get("installed") or [])))

    def read(self, id_: str, props: dict) -> ReadResult:
        missing = set(self._missing(self.conn(props), list(props["packages"])))
        return ReadResult(id_, {**props, "packages": [p for p in props["packages"] if p not in missing]})

    def delete(self, _id: str, props: dict) -> None:
        ours = list(props.get("installed") or [])
        if ours:
            self.conn(props).run(
                Script()
                .raw(
                    "if command -v apt-get >/dev/null 2>&1; then DEBIAN_FRONTEND=noninteractive apt-get remove -y "
                    + " ".join(quote(p) for p in ours)
                    + "; else dnf remove -y "
                    + " ".join(quote(p) for p in ours)
                    + "; fi"
                )
                .render()
            )


class SystemPackages(dynamic.Resource, module="host", name="SystemPackages"):
    def __init__(self, name: str, args: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(
            SystemPackagesProvider(), name, {"installed": None, **args, "version": SystemPackagesProvider.VERSION}, opts
        )


def state_script(unit: str) -> str:
    return (
        Script()
        .raw(
            f"echo enabled=$(systemctl is-enabled {quote(unit)} 2>/dev/null || true); "
            f"echo active=$(systemctl is-active {quote(unit)} 2>/dev/null || true)"
        )
        .render()
    )


def parse_state(text: str) -> dict[str, str]:
    out = {"enabled": "", "active": ""}
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k in out:
            out[k] = v.strip()
    return out


def apply_script(unit: str, action: str, check: list[str], user: Optional[str]) -> str:
    s = Script().raw("set -e")
    if user:
        s.raw(
            f"id -u {quote(user)} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "
            f"{quote(user)}"
        )
    if check:
        s.add(*check)
    s.raw("systemctl daemon-reload")
    s.add("systemctl", "enable", unit)
    if action == "reload":
        s.raw(
            f"if systemctl is-active --quiet {quote(unit)}; then systemctl reload {quote(unit)}; "
            f"else systemctl start {quote(unit)}; fi"
        )
    else:
        s.add("systemctl", "restart", unit)
    s.add("systemctl", "is-active", unit)
    return s.render()


class ServiceStateProvider(HostProvider):
    VERSION = "1"
    REPLACE_ON = ("host", "unit")
    OUTPUT_ONLY = ("prior", "state", "user_created")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        if news.get("action") not in ("restart", "reload"):
            failures.append(CheckFailure("action", "restart or reload"))
        if not isinstance(news.get("check") or [], list):
            failures.append(CheckFailure("check", "an argument list"))
        return CheckResult(news, failures)

    def _apply(self, props: dict) -> tuple[dict, bool]:
        conn = self.conn(props)
        user = props.get("user")
        user_created = False
        if user:
            user_created = conn.run(sh("id", "-u", user), check=False).rc != 0
        conn.run(apply_script(props["unit"], props["action"], list(props.get("check") or []), user))
        return parse_state(conn.run(state_script(props["unit"])).stdout), user_created

    def create(self, props: dict[str, Any]) -> CreateResult:
        prior = parse_state(self.conn(props).run(state_script(props["unit"])).stdout)
        state, user_created = self._apply(props)
        return CreateResult(
            f"{self.spec(props).name}:{props['unit']}",
            self.outputs(props, prior=prior, state=state, user_created=user_created),
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        state, _ = self._apply(news)
        return UpdateResult(
            self.outputs(news, prior=olds.get("prior"), state=state, user_created=olds.get("user_created"))
        )

    def read(self, id_: str, props: dict) -> ReadResult:
        return ReadResult(
            id_, {**props, "state": parse_state(self.conn(props).run(state_script(props["unit"])).stdout)}
        )

    def delete(self, _id: str, props: dict) -> None:
        prior = props.get("prior") or {}
        unit = props["unit"]
        s = Script()
        if prior.get("active") != "active":
            s.raw(f"systemctl stop {quote(unit)} 2>/dev/null || true")
        if prior.get("enabled") != "enabled":
            s.raw(f"systemctl disable {quote(unit)} 2>/dev/null || true")
        if props.get("user_created") and props.get("user"):
            s.raw(f"userdel {quote(props['user'])} 2>/dev/null || true")
        if s.lines:
            self.conn(props).run(s.render())


class ServiceState(dynamic.Resource, module="host", name="ServiceState"):
    state: pulumi.Output[dict]

    def __init__(self, name: str, args: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(
            ServiceStateProvider(),
            name,
            {
                "prior": None,
                "state": None,
                "user_created": None,
                "user": None,
                "check": [],
                **args,
                "version": ServiceStateProvider.VERSION,
            },
            opts,
        )
