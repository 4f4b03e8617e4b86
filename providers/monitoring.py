"""MonitoringFiles: Prometheus/Grafana configuration placed on the monitoring host, validated, reloaded in place.

Create and update write every file staged next to its target, run `promtool check rules` / `promtool check config`
on the staged copies, and only then move them into place and reload Prometheus without a restart (POST /-/reload, or
`systemctl reload`, which sends SIGHUP). A bad rule never reaches the running Prometheus. Grafana picks dashboards up
by polling its file provider; a changed datasource file restarts the Grafana unit when one is named. Delete puts
back exactly what create found (byte for byte, or absence) and reloads again.

Usage::

    MonitoringFiles("mon-files", {
        "host": host_input(spec),
        "files": {"/etc/prometheus/prometheus.yml": cfg, "/etc/prometheus/rules/gpuhost.rules.yml": rules_text},
        "config_path": "/etc/prometheus/prometheus.yml",
        "rules_paths": ["/etc/prometheus/rules/gpuhost.rules.yml"],
        "reload": {"kind": "http", "url": "http://127.0.0.1:9090"},
        "grafana_unit": None, "grafana_restart_on": [],
    })
"""

from __future__ import annotations

import hashlib
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult

from access.shell import Script, sh
from facts.files import FileState, files_script, parse_files
from facts.state import Change, Record
from providers.base import HostProvider, HostResource

STAGED = ".gpuhost-staged"


def _sha(files: dict[str, str]) -> dict[str, str]:
    return {p: hashlib.sha256(c.encode()).hexdigest() for p, c in sorted(files.items())}


def reload_command(reload: dict) -> str:
    if reload["kind"] == "http":
        # Needs --web.enable-lifecycle; a config Prometheus rejects answers 500, so curl -f fails loudly.
        base = reload["url"].rstrip("/")
        post = sh("curl", "-fsS", "-X", "POST", base + "/-/reload")
        if reload.get("when_running"):
            # First deploy: the files land before the Prometheus container starts and reads them itself.
            return f"if {sh('curl', '-fsS', '-o', '/dev/null', base + '/-/ready')} 2>/dev/null; then {post}; fi"
        return post
    if reload["kind"] == "systemd":
        return sh("systemctl", "reload", reload.get("unit", "prometheus"))
    raise ValueError(f"unknown reload kind {reload['kind']!r}")


def apply_script(props: dict, changed: list[str]) -> str:
    """Validate the staged files, move them into place, reload; staged copies are removed on any failure."""
    s = Script().raw("set -e")
    staged = {p: p + STAGED for p in sorted(props["files"])}
    s.raw("cleanup() { rm -f " + " ".join(sh(x) for x in staged.values()) + "; }")
    s.raw("trap cleanup EXIT")
    promtool = props.get("promtool", "promtool")
    for r in props.get("rules_paths", []):
        s.add(promtool, "check", "rules", staged[r])
    if props.get("config_path"):
        # Rule files are checked above from their staged copies; the final paths may not exist yet.
        s.add(promtool, "check", "config", "--syntax-only", staged[props["config_path"]])
    for p, tmp in staged.items():
        s.add("mv", "-f", "--", tmp, p)
    s.raw("trap - EXIT")
    if props.get("config_path"):
        s.raw(reload_command(props["reload"]))
    unit = props.get("grafana_unit")
    if unit and set(changed) & set(props.get("grafana_restart_on", [])):
        # Grafana has no reload for datasource provisioning; it is not in the serving path, a restart is cheap.
        s.add("systemctl", "restart", unit)
    return s.render()


class MonitoringFilesProvider(HostProvider):
    VERSION = "1"
    REPLACE_ON = ("host",)
    OUTPUT_ONLY = ("prior", "sha256")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        files = news.get("files")
        if not isinstance(files, dict) or not files:
            failures.append(CheckFailure("files", "must map absolute paths to contents"))
            files = {}
        for p, c in files.items():
            if not p.startswith("/") or ".." in p.split("/") or not isinstance(c, str):
                failures.append(CheckFailure("files", f"bad entry {p!r}: absolute path to text content"))
        cfg = news.get("config_path")
        if cfg is not None and cfg not in files:
            failures.append(CheckFailure("config_path", f"{cfg!r} is not one of the files"))
        for r in news.get("rules_paths") or []:
            if r not in files:
                failures.append(CheckFailure("rules_paths", f"{r!r} is not one of the files"))
        reload = news.get("reload") or {}
        if news.get("config_path") and reload.get("kind") not in ("http", "systemd"):
            failures.append(CheckFailure("reload", "kind must be 'http' (with url) or 'systemd' (with unit)"))
        if reload.get("kind") == "http" and not str(reload.get("url", "")).startswith("http"):
            failures.append(CheckFailure("reload.url", "must be the Prometheus base URL on the monitoring host"))
        return CheckResult(news, failures)

    def _states(self, conn, paths: list[str]) -> dict[str, FileState]:
        return parse_files(conn.run(files_script(sorted(paths)).render()).stdout)

    def _place(self, conn, props: dict, changed: list[str]) -> None:
        dirs = sorted({p.rsplit("/", 1)[0] or "/" for p in props["files"]})
        conn.run(sh("mkdir", "-p", "--", *dirs))
        for p, content in sorted(props["files"].items()):
            conn.put(p + STAGED, content.encode())
        conn.run(apply_script(props, changed))

    def _record(self, props: dict, paths: list[str]) -> Record:
        return Record(self.owner(props), files=sorted(paths))

    def _first_found(self, conn, props: dict, paths: list[str]) -> dict[str, FileState]:
        """The files as gpuhost first found them, recorded on the host (first time only) so a re-run after a
        dropped connection does not take its own files for the originals."""
        rec = self._record(props, paths)
        return rec.parse(conn.run(rec.script().render()).stdout, conn.spec.name)[0]

    def create(self, props: dict[str, Any]) -> CreateResult:
        conn = self.conn(props)
        prior = self._first_found(conn, props, list(props["files"]))
        self._place(conn, props, list(props["files"]))
        return CreateResult(
            f"{self.spec(props).name}:monitoring-files",
            self.outputs(props, prior={p: s.model_dump() for p, s in prior.items()}, sha256=_sha(props["files"])),
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        conn = self.conn(news)
        prior = dict(olds.get("prior") or {})
        added = [p for p in news["files"] if p not in prior]
        if added:
            prior.update({p: s.model_dump() for p, s in self._first_found(conn, news, added).items()})
        changed = [p for p, c in news["files"].items() if (olds.get("files") or {}).get(p) != c]
        self._place(conn, news, changed)
        dropped = [p for p in (olds.get("files") or {}) if p not in news["files"]]
        self._restore(conn, news, [FileState.model_validate(prior.pop(p)) for p in dropped])
        return UpdateResult(self.outputs(news, prior=prior, sha256=_sha(news["files"])))

    def _restore(self, conn, props: dict, states: list[FileState]) -> None:
        if states:
            ch = Change(self.owner(props)).restore({st.path: st for st in states})
            ch.forget(self._record(props, [st.path for st in states])).run(conn)

    def delete(self, _id: str, props: dict) -> None:
        conn = self.conn(props)
        priors = {p: FileState.model_validate(s) for p, s in (props.get("prior") or {}).items()}
        self._restore(conn, props, list(priors.values()))
        cfg = props.get("config_path")
        # With no config before us there is nothing for Prometheus to go back to: it keeps what it runs.
        if cfg and priors.get(cfg) and priors[cfg].exists:
            conn.run(reload_command(props["reload"]))

    def read(self, id_: str, props: dict) -> ReadResult:
        now = self._states(self.conn(props), list(props["files"]))
        files = {p: (s.text if s.exists else None) for p, s in now.items()}
        present = {p: c for p, c in files.items() if c is not None}
        return ReadResult(id_, {**props, "files": files, "sha256": _sha(present)})


class MonitoringFiles(HostResource, module="monitoring", name="MonitoringFiles"):
    sha256: pulumi.Output[dict]

    PROVIDER = MonitoringFilesProvider
    DEFAULTS = {
        "config_path": None,
        "rules_paths": [],
        "reload": None,
        "grafana_unit": None,
        "grafana_restart_on": [],
        "promtool": "promtool",
    }
