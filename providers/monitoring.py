"""MonitoringFiles: Prometheus/Grafana configuration placed on the monitoring host, validated, reloaded in place.

Create and update write every file staged next to its target, run `promtool check rules` / `promtool check config`
on the staged copies, and only then move them into place and reload Prometheus without a restart (POST /-/reload, or
`systemctl reload`, which sends SIGHUP). A bad rule never reaches the running Prometheus. Grafana picks dashboards up
by polling its file provider; a changed datasource file restarts the Grafana unit when one is named. Delete puts
back exactly what create found (byte for byte, or absence) and reloads again. Missing parent directories are made
(0755 root:root) and recorded with the files, the first time, as ManagedFile does (`made_dirs`); delete removes them
after the files, deepest first and only when empty.

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
from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from access.shell import Script, sh
from facts.files import FileState, files_script, parse_files
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider, is_safe_abs_path
from providers.effects import Effect, host_name
from providers.managed_file import dirs_key, make_dirs_lines, missing_dirs_command, parse_missing, remove_dirs_lines

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


def apply_lines(props: dict, changed: list[str]) -> list[str]:
    """After the staged copies are written: validate them, move them into place, reload; the staged copies are
    removed on any failure."""
    s = Script()
    staged = {p: p + STAGED for p in sorted(props["files"])}
    s.raw("cleanup() { rm -f " + " ".join(sh(x) for x in staged.values()) + "; }")
    s.raw("trap cleanup EXIT")
    promtool = props.get("promtool") or "promtool"
    for r in props.get("rules_paths") or []:
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
    if unit and set(changed) & set(props.get("grafana_restart_on") or []):
        # Grafana has no reload for datasource provisioning; it is not in the serving path, a restart is cheap.
        s.add("systemctl", "restart", unit)
    return s.lines


class MonitoringFilesProvider(TemplateProvider):
    VERSION = "3"  # 2: on the template; 3: the parent directories it makes recorded and removed on delete
    KIND = "monitoring-files"
    INPUTS = ("host", "files", "config_path", "rules_paths", "reload", "grafana_unit", "grafana_restart_on", "promtool")
    OUTPUT_ONLY = ("prior", "sha256", "made_dirs")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        return list(inputs.get("files") or {})

    def effects(self, olds: dict | None, news: dict) -> list[Effect]:
        # apply_lines: Prometheus reloads after every change; Grafana restarts when a file it only reads at start
        # changed.
        if olds is None:
            return []
        host, out = host_name(news), []
        if news.get("config_path"):
            out.append(Effect("restart", host, "Prometheus", "reloads its configuration (no restart)"))
        old, new = olds.get("files") or {}, news.get("files") or {}
        changed = {p for p in set(old) | set(new) if old.get(p) != new.get(p)}
        if news.get("grafana_unit") and changed & set(news.get("grafana_restart_on") or []):
            out.append(Effect("restart", host, str(news["grafana_unit"]), "restarts"))
        return out

    def validate(self, news: dict) -> list[CheckFailure]:
        failures = []
        files = news.get("files")
        if not isinstance(files, dict) or not files:
            failures.append(CheckFailure("files", "must map absolute paths to contents"))
            files = {}
        for p, c in files.items():
            if not is_safe_abs_path(p) or not isinstance(c, str):
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
        return failures

    def _record(self, props: dict, paths) -> Record:
        values = {dirs_key(p, "monitoring-files"): missing_dirs_command(p) for p in paths}
        return Record(self.owner(props), files=sorted(paths), values=values)

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn, files = self.conn(props), props["files"]
        # The files as gpuhost first found them, recorded on the host (first time only) so a re-run after a dropped
        # connection does not take its own files for the originals.
        _, found, values = self.record_and_read(conn, props, self._record(props, files), "")
        old = prior or {}
        priors = {p: st.model_dump() for p, st in found.items()}
        priors.update({p: v for p, v in (old.get("prior") or {}).items() if p in files})
        changed = [p for p, c in files.items() if (old.get("files") or {}).get(p) != c]
        made = set(old.get("made_dirs") or [])
        for p in files:
            made.update(parse_missing(values.get(dirs_key(p, "monitoring-files"), ""), p))
        ch = Change(self.owner(props)).add(make_dirs_lines(sorted(made, key=lambda d: (d.count("/"), d))))
        for p, content in sorted(files.items()):
            ch.write(p + STAGED, content.encode())
        ch.add(apply_lines(props, changed))
        dropped = sorted(set(old.get("files") or {}) - set(files))
        ch.restore({p: FileState.model_validate(old["prior"][p]) for p in dropped if p in (old.get("prior") or {})})
        ch.forget(self._record(props, dropped))
        self.guarded(conn, "placing the monitoring files", lambda: ch.run(conn), changing=True)
        return {"prior": priors, "sha256": _sha(files), "made_dirs": sorted(made)}

    def observe(self, props: dict) -> dict:
        now = parse_files(self.conn(props).run(files_script(sorted(props["files"])).render()).stdout)
        files = {p: (st.text if st.exists else None) for p, st in now.items()}
        return {"files": files, "sha256": _sha({p: c for p, c in files.items() if c is not None})}

    def restore(self, props: dict) -> Change:
        priors = {p: FileState.model_validate(st) for p, st in (props.get("prior") or {}).items()}
        ch = Change(self.owner(props)).restore(priors)
        # After the files: a directory made for them is empty again unless something else lives there now.
        ch.add(remove_dirs_lines(list(props.get("made_dirs") or []))).forget(self._record(props, priors))
        cfg = props.get("config_path")
        # With no config before us there is nothing for Prometheus to go back to: it keeps what it runs.
        if cfg and priors.get(cfg) and priors[cfg].exists:
            ch.add([reload_command(props["reload"])])
        return ch


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
