"""TritonModelRepository: the generated model repository files on the guest (config.pbtxt, model.py, ...).

Inputs carry each file's sha256 (and its content) so ``pulumi preview`` shows which file changes;
``digest`` is one hash over all of them. Create records what each path held before (content or
absence); delete puts exactly that back and removes directories it created. Read returns the hashes
the guest has now, so a hand edit of a config.pbtxt shows as drift on refresh.

Usage::

    files = repository_files(specs, gpu_count=1, model_py=...)
    TritonModelRepository("gpu-a-models", {"host": host_input(spec), "root": "/srv/triton-repo",
                          **repository_inputs(files)})
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
from typing import Any

from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, UpdateResult

from access.shell import Script, quote, sh
from access.ssh import put_script
from plans.triton_repo import repository_digest
from providers.base import HostProvider, HostResource, is_safe_abs_path


def repository_inputs(files: dict[str, bytes]) -> dict:
    """``files`` / ``digest`` inputs from a ``plans.triton_repo.repository_files`` result."""
    return {
        "files": {
            p: {"sha256": hashlib.sha256(c).hexdigest(), "content": base64.b64encode(c).decode()}
            for p, c in sorted(files.items())
        },
        "digest": repository_digest(files),
    }


def _fact_script(root: str, paths: list[str]) -> str:
    s = Script()
    s.add("echo", "@@ROOT")
    s.raw(f"if [ -d {quote(root)} ]; then echo yes; else echo no; fi")
    for p in paths:
        full = posixpath.join(root, p)
        s.add("echo", "@@FILE " + p)
        s.raw(f"if [ -f {quote(full)} ]; then base64 -w0 {quote(full)}; echo; else echo @@ABSENT; fi")
    return s.render()


def _parse_facts(text: str) -> tuple[bool, dict[str, str | None]]:
    root_exists, files, current = False, {}, None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line == "@@ROOT":
            root_exists = lines[i + 1].strip() == "yes"
        elif line.startswith("@@FILE "):
            current = line[len("@@FILE ") :]
            nxt = lines[i + 1] if i + 1 < len(lines) else "@@ABSENT"
            files[current] = None if nxt == "@@ABSENT" else nxt.strip()
    return root_exists, files


def _prior(found: dict[str, str | None]) -> dict[str, dict]:
    # Explicit records: a None value would vanish in the engine's protobuf Struct.
    return {p: {"exists": c is not None, "content": c or ""} for p, c in found.items()}


class TritonModelRepositoryProvider(HostProvider):
    VERSION = "1"
    REPLACE_ON = ("host", "root")
    OUTPUT_ONLY = ("prior", "priorRootExists")

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        root = news.get("root", "")
        if not is_safe_abs_path(root) or root == "/":
            failures.append(CheckFailure("root", f"must be an absolute directory other than /: {root!r}"))
        for p, f in (news.get("files") or {}).items():
            if p.startswith("/") or ".." in p.split("/") or not p:
                failures.append(CheckFailure(f"files.{p}", "must be a relative path without '..'"))
            elif hashlib.sha256(base64.b64decode(f.get("content", ""))).hexdigest() != f.get("sha256"):
                failures.append(CheckFailure(f"files.{p}.sha256", "does not match the content"))
        return CheckResult(news, failures)

    def _write(self, conn, root: str, files: dict, remove: list[str] = ()) -> None:
        for p, f in sorted(files.items()):
            full = posixpath.join(root, p)
            conn.run(
                sh("mkdir", "-p", posixpath.dirname(full)) + "\n" + put_script(full, mode="0644"),
                input=base64.b64decode(f["content"]),
            )
        for p in remove:
            conn.run(sh("rm", "-f", "--", posixpath.join(root, p)))

    def create(self, props: dict) -> CreateResult:
        conn = self.conn(props)
        root, files = props["root"], props["files"]
        root_exists, prior = _parse_facts(conn.run(_fact_script(root, sorted(files))).stdout)
        self._write(conn, root, files)
        return CreateResult(
            f"{props['host']['name']}:{root}", self.outputs(props, prior=_prior(prior), priorRootExists=root_exists)
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        conn = self.conn(news)
        root = news["root"]
        prior = dict(olds.get("prior") or {})
        new_paths = sorted(set(news["files"]) - set(prior))
        if new_paths:
            _, found = _parse_facts(conn.run(_fact_script(root, new_paths)).stdout)
            prior.update(_prior(found))
        changed = {p: f for p, f in news["files"].items() if (olds.get("files") or {}).get(p) != f}
        gone = sorted(set(olds.get("files") or {}) - set(news["files"]))
        self._write(conn, root, changed)
        self._restore(conn, root, {p: prior.get(p) for p in gone})
        return UpdateResult(self.outputs(news, prior=prior, priorRootExists=olds.get("priorRootExists", True)))

    def _restore(self, conn, root: str, prior: dict[str, Any]) -> None:
        for p, record in sorted(prior.items()):
            full = posixpath.join(root, p)
            if not record or not record.get("exists"):
                conn.run(sh("rm", "-f", "--", full))
            else:
                conn.run(put_script(full), input=base64.b64decode(record["content"]))

    def delete(self, _id: str, props: dict) -> None:
        conn = self.conn(props)
        root = props["root"]
        self._restore(conn, root, props.get("prior") or {})
        if not props.get("priorRootExists", True):
            # Only empty directories go: anything not ours (an engine plan built there) stays.
            conn.run(Script().raw(f"find {quote(root)} -depth -type d -empty -delete 2>/dev/null || true").render())

    def read(self, id_: str, props: dict) -> ReadResult:
        conn = self.conn(props)
        _, found = _parse_facts(conn.run(_fact_script(props["root"], sorted(props.get("files") or {}))).stdout)
        files = {
            p: {"sha256": hashlib.sha256(base64.b64decode(c)).hexdigest(), "content": c}
            for p, c in found.items()
            if c is not None
        }
        return ReadResult(id_, {**props, "files": files})


class TritonModelRepository(HostResource, module="serving", name="TritonModelRepository"):
    PROVIDER = TritonModelRepositoryProvider
