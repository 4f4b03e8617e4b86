"""SystemdService: one systemd unit kept enabled and running — its files written when gpuhost owns them, a check
before every (re)start, restart or reload — and put back as found on delete. ServiceState (below) is the same
provider for a unit gpuhost does not write (a package's nginx, a unit file from a ManagedFile).

Create records on the host, the first time only, what each file held (content, mode, owner, or absence), the
unit's enabled/active state and whether `user` existed; then, under the host lock: the files written atomically,
`user` created if missing, `check` run (e.g. `nginx -t`: a bad config never reaches the running server),
`daemon-reload`, `enable`, then `restart` (action "restart") or reload-else-start (action "reload"), and
`is-active`. Any change of an input (`trigger`: a config's sha256, a repository digest) does it again. Read
returns the files as they are and whether the unit is enabled and active, so a hand edit or a stopped service is
drift that `up` repairs. Delete stops and disables the unit unless create found it so, puts the files back byte
for byte and removes a user it created.

Usage::

    SystemdService("svc-adaptive-window", {"host": host_input(spec), "unit": "gpuhost-adaptive-window.service",
                   "files": {"/etc/systemd/system/gpuhost-adaptive-window.service": unit_text,
                             "/usr/local/lib/gpuhost-adaptive-window.py": program}})
    ServiceState("svc-nginx", {"host": host_input(spec), "unit": "nginx", "action": "reload",
                 "check": ["nginx", "-t", "-c", "/etc/nginx/nginx.conf"], "trigger": conf.sha256})
"""

from __future__ import annotations

import hashlib
import re
from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access.shell import Script, quote, sh
from facts.files import FileState, files_script, parse_files
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider, host_identity, is_safe_abs_path
from providers.effects import Effect, host_name

UNIT_RE = re.compile(r"^[A-Za-z0-9@._\-]+$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# `is-enabled` answers meaning "starts at boot as far as this unit can": a unit without an [Install] section is
# static, and `enable` cannot make it more; reading it as not enabled would be drift that no `up` repairs.
ENABLED = ("enabled", "enabled-runtime", "static", "generated", "alias")


def state_script(unit: str) -> str:
    return (
        f"echo enabled=$({sh('systemctl', 'is-enabled', unit)} 2>/dev/null || true); "
        f"echo active=$({sh('systemctl', 'is-active', unit)} 2>/dev/null || true)"
    )


def parse_state(text: str) -> dict[str, str]:
    out = {"enabled": "", "active": ""}
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k in out:
            out[k] = v.strip()
    return out


def status_script(unit: str, paths: list[str]) -> Script:
    return files_script(paths).raw("echo '@@unit'").raw(state_script(unit))


def parse_status(text: str) -> tuple[dict[str, FileState], bool, bool]:
    """(files, enabled, active) from the output of ``status_script``."""
    files_part, _, unit_part = text.partition("@@unit\n")
    st = parse_state(unit_part)
    return parse_files(files_part), st["enabled"] in ENABLED, st["active"] == "active"


def start_lines(unit: str, action: str, check: list[str], user: Optional[str]) -> list[str]:
    """After the files are in place: the user, the check, then the unit enabled and (re)started or reloaded."""
    s = Script()
    if user:
        s.raw(
            f"id -u {quote(user)} >/dev/null 2>&1 || "
            + sh("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user)
        )
    if check:
        s.add(*check)
    s.raw("systemctl daemon-reload").add("systemctl", "enable", "--quiet", unit)
    if action == "reload":
        s.raw(
            f"if {sh('systemctl', 'is-active', '--quiet', unit)}; then {sh('systemctl', 'reload', unit)}; "
            f"else {sh('systemctl', 'start', unit)}; fi"
        )
    else:
        s.add("systemctl", "restart", unit)
    return [*s.lines, sh("systemctl", "is-active", "--quiet", unit)]


def stop_lines(unit: str, found: dict) -> list[str]:
    """Back to the enabled/active state create found (a unit that did not exist is stopped and disabled)."""
    out = []
    if found.get("active") != "active":
        out.append(sh("systemctl", "stop", unit) + " 2>/dev/null || true")
    if found.get("enabled") != "enabled":
        out.append(sh("systemctl", "disable", "--quiet", unit) + " 2>/dev/null || true")
    return out


def _sha(files: dict[str, str]) -> dict[str, str]:
    return {p: hashlib.sha256(c.encode()).hexdigest() for p, c in sorted(files.items())}


class SystemdServiceProvider(TemplateProvider):
    VERSION = "3"  # 3: a static unit counts as enabled; 2: one provider for SystemdService and ServiceState; priors recorded on the host
    KIND = "service"
    # Another unit name is another service: stop and restore the old one, then start the new one.
    REPLACE_ON = ("host", "unit")
    # `enabled` and `active` are wanted (True) and read back from the host: a unit stopped or disabled by hand is
    # drift that `up` repairs.
    INPUTS = ("host", "unit", "files", "enabled", "active", "action", "check", "user", "trigger")
    OUTPUT_ONLY = ("priors", "sha256", "prior", "user_created")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        return list(inputs.get("files") or {})

    DERIVED = (("trigger",),)  # a config's sha256, a repository digest: what it follows is shown itself

    def effects(self, olds: dict | None, news: dict) -> list[Effect]:
        # Every update runs start_lines again: the unit restarts, or reloads (started if it was stopped).
        if olds is None:
            return []
        host, unit = host_name(news), str(news.get("unit"))
        if olds.get("unit") != news.get("unit") or host_identity(olds.get("host")) != host_identity(news.get("host")):
            return [
                Effect("restart", host_name(olds), str(olds.get("unit")), "stops (replaced)"),
                Effect("restart", host, unit, "starts in its place"),
            ]
        if news.get("action") == "reload":
            return [Effect("restart", host, unit, "reloads (no restart; started if it was stopped)")]
        return [Effect("restart", host, unit, "restarts")]

    def validate(self, news: dict) -> list[CheckFailure]:
        failures = []
        unit = news.get("unit")
        if not isinstance(unit, str) or not UNIT_RE.match(unit):
            failures.append(CheckFailure("unit", f"must be a unit name like 'name.service': {unit!r}"))
        files = news.get("files") or {}
        if not isinstance(files, dict):
            failures.append(CheckFailure("files", "must map absolute paths to file contents"))
        else:
            for p, c in files.items():
                if not is_safe_abs_path(p) or not isinstance(c, str):
                    failures.append(CheckFailure("files", f"bad entry {p!r}: absolute path to text content"))
            if files and isinstance(unit, str) and f"/etc/systemd/system/{unit}" not in files:
                failures.append(CheckFailure("files", f"must include the unit file /etc/systemd/system/{unit}"))
        for k in ("enabled", "active"):
            if news.get(k, True) is not True:
                failures.append(CheckFailure(k, "a service is always wanted enabled and running"))
        if news.get("action", "restart") not in ("restart", "reload"):
            failures.append(CheckFailure("action", "restart or reload"))
        check = news.get("check") or []
        if not isinstance(check, list) or not all(isinstance(a, str) for a in check):
            failures.append(CheckFailure("check", "an argument list"))
        user = news.get("user")
        if user is not None and not (isinstance(user, str) and USER_RE.match(user)):
            failures.append(CheckFailure("user", f"a system user name like 'triton-server': {user!r}"))
        return failures

    def _record(self, props: dict, paths) -> Record:
        values = {f"systemd/{props['unit']}": state_script(props["unit"])}
        if props.get("user"):
            values[f"user/{props['user']}"] = sh("id", "-u", props["user"])
        return Record(self.owner(props), files=sorted(paths), values=values)

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn, unit, user = self.conn(props), props["unit"], props.get("user")
        files: dict[str, str] = props.get("files") or {}
        rec = self._record(props, files)
        _, found, values = self.record_and_read(conn, props, rec, "")
        old = prior or {}
        # Outputs of an earlier create win: they are what it found, before any record existed on the host.
        priors = {p: s.model_dump() for p, s in found.items()}
        priors.update({p: v for p, v in (old.get("priors") or {}).items() if p in files})
        ch = Change(self.owner(props))
        dropped = sorted(set(old.get("files") or {}) - set(files))
        ch.restore({p: FileState.model_validate(old["priors"][p]) for p in dropped if p in (old.get("priors") or {})})
        ch.forget(Record(rec.owner, files=dropped))
        for path, content in sorted(files.items()):
            ch.write(path, content.encode(), "0644", "0:0")
        ch.add(start_lines(unit, props.get("action") or "restart", list(props.get("check") or []), user))
        self.guarded(conn, f"starting {unit}", lambda: ch.run(conn), changing=True)
        return {
            "priors": priors,
            "sha256": _sha(files),
            "prior": old.get("prior") or parse_state(values.get(f"systemd/{unit}", "")),
            "user_created": old.get("user_created") if prior else bool(user) and not values.get(f"user/{user}"),
        }

    def observe(self, props: dict) -> dict:
        paths = sorted(props.get("files") or {})
        out = self.conn(props).run(status_script(props["unit"], paths).render()).stdout
        files, enabled, active = parse_status(out)
        now = {p: files[p].text for p in paths if files[p].exists}
        return {"files": now, "sha256": _sha(now), "enabled": enabled, "active": active}

    def restore(self, props: dict) -> Change:
        unit, files = props["unit"], props.get("files") or {}
        ch = Change(self.owner(props)).add(stop_lines(unit, props.get("prior") or {}))
        priors = props.get("priors") or {}
        ch.restore({p: FileState.model_validate(priors[p]) for p in files if p in priors})
        if files:
            ch.add(["systemctl daemon-reload"])
        if props.get("user_created") and props.get("user"):
            ch.add([sh("userdel", props["user"]) + " 2>/dev/null || true"])
        return ch.forget(self._record(props, files))


class SystemdService(HostResource, module="host", name="SystemdService"):
    unit: pulumi.Output[str]
    active: pulumi.Output[bool]

    PROVIDER = SystemdServiceProvider
    DEFAULTS = {"enabled": True, "active": True, "action": "restart", "check": [], "user": None, "trigger": None}


class ServiceState(SystemdService, module="host", name="ServiceState"):
    """A unit gpuhost does not write (a package's nginx, Triton's unit in the process runtime): this provider with
    no files. Its own type token stays `host:ServiceState`, so stacks keep their resources."""

    DEFAULTS = {**SystemdService.DEFAULTS, "files": {}}
