"""TritonModelRepository: the generated model repository files on the guest (config.pbtxt, model.py, ...).

Inputs carry each file's sha256 (and its content) so ``pulumi preview`` shows which file changes;
``digest`` is one hash over all of them. Before the first change each file (content, mode, owner, or absence) and
whether each directory existed are recorded on the host (pristine/), so a re-run after a dropped connection
keeps the real originals; delete puts exactly that back and removes the directories it created (only when empty:
an engine plan built there stays). Read returns the hashes the guest has now, so a hand edit of a config.pbtxt
shows as drift on refresh. Decisions are in plans/triton_repo.py.

Usage::

    files = repository_files(specs, gpu_count=1, model_py=...)
    TritonModelRepository("gpu-a-models", {"host": host_input(spec), "root": "/srv/triton-repo",
                          **repository_inputs(files)})
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
from typing import Optional

from pulumi.dynamic import CheckFailure

from access.shell import quote
from facts.files import FileState, files_script, parse_files
from plans.triton_repo import plan_repository, repository_digest, repository_dirs
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider
from providers.serving_snapshot import MARKER


def repository_inputs(files: dict[str, bytes]) -> dict:
    """``files`` / ``digest`` inputs from a ``plans.triton_repo.repository_files`` result."""
    return {
        "files": {
            p: {"sha256": hashlib.sha256(c).hexdigest(), "content": base64.b64encode(c).decode()}
            for p, c in sorted(files.items())
        },
        "digest": repository_digest(files),
    }


def _dir_key(d: str) -> str:
    return f"dir{d}/state"


def _dir_of(key: str) -> str:
    return key.removeprefix("dir").removesuffix("/state")


class TritonModelRepositoryProvider(TemplateProvider):
    VERSION = "3"  # 3: prior_root_exists, was priorRootExists (an output, never read back)
    KIND = "triton-repository"
    INPUTS = ("host", "root", "files", "digest")
    REPLACE_ON = ("host", "root")
    OUTPUT_ONLY = ("prior", "prior_root_exists", "prior_dirs", "plan")

    @classmethod
    def writes(cls, inputs: dict) -> list:
        root = str(inputs["root"]).rstrip("/")
        return [f"{root}/{rel}" for rel in inputs.get("files") or {}]

    PATHS = ("root",)
    # One hash over the files, each file's sha256 beside its content, and the marker file holding the digest.
    DERIVED = (("digest",), ("files", "*", "sha256"), ("files", MARKER))

    def validate(self, news: dict) -> list[CheckFailure]:
        failures: list[CheckFailure] = []
        for p, f in (news.get("files") or {}).items():
            if p.startswith("/") or ".." in p.split("/") or not p:
                failures.append(CheckFailure(f"files.{p}", "must be a relative path without '..'"))
            elif hashlib.sha256(base64.b64decode(f.get("content", ""))).hexdigest() != f.get("sha256"):
                failures.append(CheckFailure(f"files.{p}.sha256", "does not match the content"))
        return failures

    def _record(self, props: dict, rels, dirs) -> Record:
        root = props["root"]
        return Record(
            self.owner(props),
            files=[posixpath.join(root, p) for p in sorted(rels)],
            values={_dir_key(d): f"if [ -d {quote(d)} ]; then echo present; else echo absent; fi" for d in dirs},
        )

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        root, files = props["root"], props["files"]
        rec = self._record(props, files, repository_dirs(root, list(files)))
        full = {p: posixpath.join(root, p) for p in files}
        out, pristine, values = self.record_and_read(conn, props, rec, files_script(sorted(full.values())).render())
        now = parse_files(out)
        p = plan_repository(
            root, {r: base64.b64decode(f["content"]) for r, f in files.items()}, {r: now[a] for r, a in full.items()}
        )
        # Files no longer in the repository go back to what they were; their records go with them.
        old = {r: FileState.model_validate(s) for r, s in ((prior or {}).get("prior") or {}).items()}
        gone = {posixpath.join(root, r): s for r, s in old.items() if r not in files}
        ch = Change(self.owner(props)).restore(gone).forget(Record(rec.owner, files=sorted(gone)))
        self.run_plan(conn, props, p, ch)
        dirs = {**{_dir_of(k): v for k, v in values.items()}, **((prior or {}).get("prior_dirs") or {})}
        return {
            "prior": {r: pristine[a].model_dump() for r, a in full.items()},
            "prior_root_exists": dirs.get(root) != "absent",
            "prior_dirs": dirs,
            "plan": p.sentences,
        }

    def observe(self, props: dict) -> dict:
        root = props["root"]
        now = parse_files(
            self.conn(props)
            .run(files_script(sorted(posixpath.join(root, p) for p in props.get("files") or {})).render())
            .stdout
        )
        files = {
            posixpath.relpath(a, root): {"sha256": hashlib.sha256(st.content).hexdigest(), "content": st.content_b64}
            for a, st in now.items()
            if st.exists
        }
        return {"files": files}

    def restore(self, props: dict) -> Change:
        root = props["root"]
        prior = {posixpath.join(root, r): FileState.model_validate(s) for r, s in (props.get("prior") or {}).items()}
        dirs = props.get("prior_dirs") or {}
        ch = Change(self.owner(props)).restore(prior)
        # Deepest first, and only empty ones: anything not ours (an engine plan built there) stays.
        for d in sorted((d for d, v in dirs.items() if v == "absent"), key=lambda d: -d.count("/")):
            ch.add([f"rmdir -- {quote(d)} 2>/dev/null || true"])
        return ch.forget(Record(self.owner(props), files=sorted(prior), values={_dir_key(d): "" for d in dirs}))


class TritonModelRepository(HostResource, module="serving", name="TritonModelRepository"):
    PROVIDER = TritonModelRepositoryProvider
