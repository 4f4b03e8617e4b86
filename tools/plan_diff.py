"""What a pull request changes in each stack, resource by resource: the program under Pulumi mocks at the PR's base
and at its head, compared and rendered the way `pulumi preview --diff` shows a plan, led by what happens on which host.

It is a declared-state diff, not a preview: no refresh, no host is contacted, no provider `check` runs (preflight
included) and no secret is read (every stack secret is one fixed, public key, the same at both commits and on every
run). Each commit is checked out into its own temporary `git worktree` and planned there in a subprocess, with that
tree's code and that tree's stack file. Whether a change updates or replaces a resource, and what that does to what
runs, is the head's provider's own answer: the provider (unpickled from the resource's `__provider` input, as the
engine does) is asked `diff(olds, news)` and `effects(olds, news)` (providers.effects); a child whose provider is not
gpuhost's (a pulumi-docker container) is named by its component (`Wired.RECREATED`).

Output (Markdown; the workflow writes it to the job summary and a PR comment): the disclaimer once, then per stack::

    ### `hk-prod`: base `1a2b3c4` → head `5d6e7f8`
    - **Reboots:** `trt-l40s-01` reboots: kernel argument `nosmt` added (its running VMs are shut down first ...).
    - **Restarts:** on `rhel-mt-01-tenant-a100`: `gpuhost-triton` restarts.
    - **Gates re-run:** `resnet50` on `rhel-mt-01-tenant-a100`: 8 connections for 10 s, up to 200,000 requests ...
    - **Replaced** (deleted, then created again): none.
    **Plan digest** of `hk-prod`: `sha256:…` (main's apply job recomputes it and refuses another plan).
    3 to update, 1 to replace, 225 unchanged (derived: 8 values, not listed: hashes that follow the lines shown).
    ~ resnet-rhel-models (serving:TritonModelRepository): update
        ~ files["resnet50/config.pbtxt"].content: base64 text, 419 → 419 bytes
            -  max_queue_delay_microseconds: 1500

Markers: `+` create, `-` delete, `~` update (only the changed input paths, old → new), `+-` replace (the inputs the
provider replaces on, and what depends on it and goes too). Inputs a provider declares derived (`DERIVED`: restart
triggers, digests, a file's sha256 beside its content) and texts whose only change is a sha256 are counted, not
listed. Secrets and large values are shown as sha256 and size; file contents (also base64 ones) as a unified diff
when they are text. Changed dependency edges alone are no change (the engine updates nothing for them), nor a
provider `version` bump the provider's diff ignores. A stack config the loader refuses prints the loader's lines
instead (exit status 1); so does a stack whose plan fails or does not finish in SNAPSHOT_TIMEOUT_S, and the other
stacks are still planned and shown. The plan digest (`plan_digest`: the steps and their inputs, secrets masked) is
what main's apply job checks before `up` (tools/plan_check.py).

`--declared STACK...` prints what a stack declares instead, at the tree it runs in (`declared`): each resource type
with its count, then every resource's inputs (secrets, providers and hosts hidden), under the same mocks and the same
throwaway key; the same text on every run, so two trees compare byte for byte.

Everything that comes from the pull request (stack names, resource names, keys and values, loader lines, program
output) is printed in code: a code span or block whose backtick fence is longer than any run of backticks inside it,
with control characters written as escapes, so it cannot close its fence, start a line, render HTML (`<img>`) or
mention anyone (`@org/team`).

Usage::

    .venv/bin/python -m tools.plan_diff --base origin/main --head HEAD              # every Pulumi.*.yaml
    .venv/bin/python -m tools.plan_diff --base "$BASE_SHA" --head "$HEAD_SHA" hk-prod >> "$GITHUB_STEP_SUMMARY"
    .venv/bin/python -m tools.plan_diff --declared hk-prod                          # what hk-prod declares
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import difflib
import fnmatch
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DECLARED = (
    "> Declared-state diff: the program run under Pulumi mocks at the base and at the head commit, compared. No "
    "refresh, no host contacted, no secret read, preflight not run. The real `pulumi preview --diff` (refresh and "
    "preflight against the hosts) runs on main before `up`."
)
# What HostReboot compares with the running host (providers/reboot.unmet): a change here is a reboot.
REBOOT_INPUTS = ("expect_args", "expect_absent", "expect_drivers")
REBOOT_TYPE = "pulumi-python:dynamic/host:HostReboot"
LARGE = 160  # characters: a longer one-line value is shown as sha256 and size
BODY = "\t"  # marks a line of a text diff among the changed paths
DERIVED_MARK = "\x00"  # marks a changed path that only carries a hash of others (counted, not listed)
_HASH = re.compile(r"\b[0-9a-f]{64}\b")  # a sha256 in a text: a text whose only changes are these is derived
MAX_LIST = 12  # dependents named before "and N more"
SNAPSHOT_TIMEOUT_S = 600
DIGEST_HEAD = "**Plan digest** of"  # the line main's apply job reads back (tools.plan_check)
FOREIGN = "not a gpuhost provider: update or replace is its provider's call"
# Inputs `declared` leaves out: the pickled provider, the connection, what a resource found before it (restore).
HIDDEN = ("__provider", "host", "prior")


# -- planning one tree (runs inside the tree, in its own process) -----------------------------------------------------
def _canonical(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _provider(provider_blob: Any) -> Any:
    """The resource's provider as the engine would run it (unpickled from its `__provider` input), or None."""
    blob = provider_blob.get("value") if isinstance(provider_blob, dict) else provider_blob
    if not isinstance(blob, str):
        return None
    import dill  # type: ignore[import-untyped]  # what pulumi.dynamic stores providers with

    return dill.loads(base64.b64decode(blob))


def _verdict(provider: Any, olds: dict, news: dict) -> dict:
    """The provider's own diff of olds → news: {"changes", "replaces", "rule"} (rule: where the answer came from)."""
    if provider is None:
        return {"changes": olds != news, "replaces": [], "rule": None}
    d = provider.diff("planned", olds, news)
    changes = True if d.changes is None else bool(d.changes)
    return {"changes": changes, "replaces": sorted(d.replaces or []), "rule": type(provider).__name__}


def _effects(provider: Any, olds: dict | None, news: dict) -> list[dict]:
    """What the provider says applying olds → news does to what runs (providers.effects), as dicts."""
    fn = getattr(provider, "effects", None)  # an older tree's providers say nothing
    return [e.as_dict() for e in fn(olds, news)] if fn is not None else []


def _recreated(rec: Any) -> dict[str, tuple[str, list]]:
    """Children whose provider is not gpuhost's and that their component declares recreated on any change
    (components.wiring.Wired.RECREATED): URN → (what restarts, in words; the inputs that only carry a hash)."""
    try:
        from components.wiring import Wired
    except ImportError:
        return {}
    kinds = getattr(Wired, "BY_TYPE", {})
    by_urn = {r.urn: r for r in rec.registrations}
    out = {}
    for r in rec.registrations:
        parent = by_urn.get(r.parent)
        if parent is None or not r.custom or "__provider" in r.inputs or parent.type not in kinds:
            continue
        cls = kinds[parent.type]
        suffix = r.name[len(parent.name) + 1 :]
        for pattern, words in getattr(cls, "RECREATED", {}).items():
            if fnmatch.fnmatchcase(suffix, pattern):
                out[r.urn] = (words, [list(p) for p in getattr(cls, "RECREATED_DERIVED", ())])
    return out


def _sibling_host(r: Any, registrations: list) -> str:
    """The one machine a resource's gpuhost siblings (same component) name as `host`, or "" (several, or none)."""
    hosts = {
        str(s.inputs["host"].get("name"))
        for s in registrations
        if s.parent == r.parent and isinstance(s.inputs.get("host"), dict)
    }
    return hosts.pop() if len(hosts) == 1 else ""


def snapshot(stack: str, key_pem: str, against: dict | None = None) -> dict:
    """Plan `stack` of the tree this process runs in: {"stack", "error", "resources", "verdicts", "effects"}.

    `against`: an earlier snapshot (the base). For every resource in both whose inputs differ, this tree's provider
    says whether it is an update or a replacement (`verdicts`, by URN); for those that change and those that are
    new, what that does to what runs (`effects`, by URN); each resource's `derived` input paths (hashes of others).
    """
    from testbed.mocks import attempt_program
    from testbed.stackfiles import stack_config

    try:
        cfg, secret = stack_config(stack)  # the stack file's own checks (nesting, alias bombs) raise here
    except Exception as e:  # noqa: BLE001 - shown as the loader's lines, like the program's own refusal
        err: BaseException | None = e
    else:
        for k in secret:
            cfg[k] = key_pem
        rec, err = attempt_program(cfg, secret, stack=stack)
    if err is not None:
        lines = str(err).splitlines() or [repr(err)]
        return {"stack": stack, "error": lines, "resources": [], "verdicts": {}}
    old = {r["urn"]: r for r in (against or {}).get("resources", [])}
    recreated = _recreated(rec) if against is not None else {}
    resources, verdicts, effects = [], {}, {}
    for r in rec.registrations:
        inputs = _canonical({k: v for k, v in r.inputs.items() if k != "__provider"})
        res = {
            "urn": r.urn,
            "type": r.type,
            "name": r.name,
            "parent": r.parent,
            "custom": r.custom,
            "dependencies": sorted(set(r.dependencies)),
            "secret": sorted(k for k in r.secret_inputs if k != "__provider"),
            "inputs": inputs,
        }
        resources.append(res)
        if against is None or not r.custom:
            continue
        provider = _provider(r.inputs.get("__provider"))
        res["derived"] = [list(p) for p in getattr(provider, "DERIVED", ())]
        o = old.get(r.urn)
        if o is not None and o["inputs"] != inputs:
            verdicts[r.urn] = v = _verdict(provider, o["inputs"], inputs)
            if v["changes"] and provider is not None:
                effects[r.urn] = _effects(provider, o["inputs"], inputs)
        elif o is None and provider is not None:
            effects[r.urn] = _effects(provider, None, inputs)
        if r.urn in recreated:
            words, res["derived"] = recreated[r.urn]
            if o is not None and o["inputs"] != inputs:
                what = inputs.get("name") if isinstance(inputs.get("name"), str) else r.name
                host = _sibling_host(r, rec.registrations)
                effects[r.urn] = [{"kind": "restart", "host": host, "what": what, "how": words, "load": {}}]
    effects = {u: e for u, e in effects.items() if e}
    return {"stack": stack, "error": None, "resources": resources, "verdicts": verdicts, "effects": effects}


# -- planning a commit ----------------------------------------------------------------------------------------------
def declared(stack: str) -> tuple[str, bool]:
    """What `stack` declares, as Markdown: each resource type and its count, then every resource's inputs (one line
    each, sorted by name; `HIDDEN` left out). Not a preview: no refresh, no host contacted, no provider `check`
    (preflight included); the stack's secrets are `throwaway_key()`. It runs the whole stack loader, so a bad config
    comes back as its lines and False."""
    from testbed.mocks import attempt_program
    from testbed.stackfiles import stack_config

    cfg, secret = stack_config(stack)
    key = throwaway_key()
    for k in secret:
        cfg[k] = key
    rec, err = attempt_program(cfg, secret, stack=stack)
    out = [f"### `{stack}`: declared resources (Pulumi mocks: no refresh, hosts not contacted, no secrets)", ""]
    if err is not None:
        out += ["```", str(err), "```"]
        return "\n".join(out) + "\n", False
    counts = Counter(r.type for r in rec.registrations)
    out += ["| type | count |", "| --- | --- |"] + [f"| `{t}` | {n} |" for t, n in sorted(counts.items())]
    out += ["", "<details><summary>inputs per resource</summary>", "", "```"]
    # By name: registrations arrive in the order their inputs resolve, which varies between runs.
    for r in sorted(rec.registrations, key=lambda r: (r.name, r.type)):
        if r.custom:
            shown = {k: v for k, v in sorted(r.inputs.items()) if k not in HIDDEN and v is not None}
            out.append(f"{r.name} ({r.type}): {json.dumps(shown, default=str, sort_keys=True)[:2000]}")
    out += ["```", "</details>", ""]
    return "\n".join(out), True


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def checkout(repo: Path, commit: str) -> Iterator[Path]:
    """`commit` checked out into a temporary worktree of `repo` (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="plan-diff-") as tmp:
        tree = Path(tmp) / "tree"
        git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
        try:
            yield tree
        finally:
            git(repo, "worktree", "remove", "--force", str(tree))


def stacks_in(tree: Path) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in tree.glob("Pulumi.*.yaml"))


def plan_tree(tree: Path, stack: str, key_pem: str, against: dict | None = None) -> dict:
    """Snapshot `stack` in `tree`, in a subprocess that imports only that tree's code."""
    if not (tree / f"Pulumi.{stack}.yaml").exists():
        return {"stack": stack, "error": None, "resources": [], "verdicts": {}, "absent": True}
    with tempfile.TemporaryDirectory(prefix="plan-diff-io-") as io:
        key, base, out = Path(io) / "key", Path(io) / "against.json", Path(io) / "out.json"
        key.write_text(key_pem)
        base.write_text(json.dumps(against or {}))
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
        env.pop("PULUMI_CONFIG_PASSPHRASE", None)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--snapshot", stack, str(key), str(base), str(out)]
        try:
            p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=SNAPSHOT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            why = f"the plan did not finish in {SNAPSHOT_TIMEOUT_S} s and was stopped (a config that expands without end?)"
            return {"stack": stack, "error": [why], "resources": []}
        if p.returncode != 0 or not out.exists():
            tail = (p.stderr or p.stdout).strip().splitlines()[-15:]
            return {"stack": stack, "error": ["the program did not run under mocks:", *tail], "resources": []}
        try:
            result: dict = json.loads(out.read_text())
        except (ValueError, RecursionError):
            return {"stack": stack, "error": ["the plan's output is not JSON"], "resources": []}
        return result


def throwaway_key() -> str:
    """One fixed, public ed25519 key in place of every stack secret, for both commits, `declared` and every run: what
    derives from it (guests' authorized key) compares equal, and a plan's digest comes out the same on the pull
    request and on main. Not a secret: it never reaches a host."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    seed = hashlib.sha256(b"gpuhost mock plan: public throwaway key").digest()
    pem = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return pem.decode()


def plan_commits(repo: Path, base: str, head: str, stacks: list[str] | None = None) -> Iterator[tuple[dict, dict]]:
    """(base snapshot, head snapshot) of each stack: `stacks`, or every Pulumi.*.yaml of either commit. A stack
    whose planning fails comes back as an error snapshot; the next stack is planned all the same."""
    key = throwaway_key()
    with checkout(repo, base) as btree, checkout(repo, head) as htree:
        names = stacks or sorted(set(stacks_in(btree)) | set(stacks_in(htree)))
        for s in names:
            b = _guarded(btree, s, key)
            yield b, _guarded(htree, s, key, against=b)


def _guarded(tree: Path, stack: str, key_pem: str, against: dict | None = None) -> dict:
    """`plan_tree`, with a failure as the stack's error snapshot (one stack's failure is not the comment's loss)."""
    try:
        return plan_tree(tree, stack, key_pem, against)
    except Exception as e:  # noqa: BLE001 - any failure: the other stacks are still planned and shown
        return {"stack": stack, "error": [f"the plan failed: {type(e).__name__}: {e}"], "resources": []}


# -- rendering ------------------------------------------------------------------------------------------------------
# Control characters (tab kept: text diffs hold tabs), the line and paragraph separators, bidi controls, surrogates.
_CONTROL = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _plain(text: Any) -> str:
    """`text` on one line: every control character written as its JSON escape (`\\n`, `\\u001b`)."""
    return _CONTROL.sub(lambda m: json.dumps(m.group())[1:-1], str(text))


def _fence(text: str, least: int) -> str:
    runs = re.findall(r"`+", text)
    return "`" * max(least, 1 + max((len(r) for r in runs), default=0))


def code(text: Any) -> str:
    """PR-controlled text as a Markdown code span that nothing inside can close.

    >>> code("a``b")
    '```a``b```'
    """
    s = _plain(text).replace("\t", "\\t")
    fence = _fence(s, 1)
    pad = " " if s.startswith(("`", " ")) or s.endswith(("`", " ")) or not s else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def block(lines: list[Any], info: str = "") -> list[str]:
    """PR-controlled lines as a fenced code block that no line inside can close (tabs kept)."""
    body = [_plain(ln) for ln in lines]
    fence = _fence("\n".join(body), 3)
    return [fence + info, *body, fence]


def short_type(t: str) -> str:
    return t.split("dynamic/", 1)[1] if "dynamic/" in t else t.split(":", 1)[1] if t.startswith("gpuhost:") else t


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) else json.dumps(k)


def _path(path: tuple) -> str:
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p):
            out += ("." if out else "") + p
        else:
            out += f"[{json.dumps(p)}]"
    return out


def _digest(text: str) -> str:
    b = text.encode()
    return f"sha256:{hashlib.sha256(b).hexdigest()[:16]}… ({len(b)} bytes)"


def _as_text(value: Any, key: Any) -> str | None:
    """The value as multi-line text, if it is one (base64 `content` decoded), else None."""
    if not isinstance(value, str):
        return None
    if "\n" in value:
        return value
    decoded = _b64_text(value) if key == "content" else None
    return decoded if decoded is not None and "\n" in decoded else None


def _b64_text(value: Any) -> str | None:
    """A base64 `content` input decoded, when it is printable text."""
    if not isinstance(value, str) or len(value) < 4:
        return None
    try:
        decoded = base64.b64decode(value, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return decoded if decoded.isprintable() or "\n" in decoded else None


def _fmt(value: Any, secret: bool = False) -> str:
    text = json.dumps(value, sort_keys=True)
    if secret:
        return f"[secret {_digest(text)}]"
    if len(text) > LARGE:
        return f"[{_digest(text)}]"
    return text


def value_changes(
    old: Any, new: Any, path: tuple = (), secret: bool = False, derived: tuple[tuple, ...] = ()
) -> list[str]:
    """Lines for every changed leaf under `path`: `path: old → new`, `path: + new`, `path: - old`, text as a diff.
    A leaf under a `derived` pattern (providers.effects: a hash of other inputs) is one line marked DERIVED_MARK."""
    if old == new:
        return []
    if derived:
        from providers.effects import matches  # the tool's own checkout; never the planned tree's

        if any(matches(path, tuple(p)) for p in derived):
            return [DERIVED_MARK + ln for ln in value_changes(old, new, path, secret) if not ln.startswith(BODY)]
    if secret:
        return [f"{_path(path)}: {_fmt(old, True)} → {_fmt(new, True)}"]
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            if k not in new:
                out.append(f"{_path((*path, k))}: - {_fmt(old[k])}")
            elif k not in old:
                out += _added(new[k], (*path, k))
            else:
                out += value_changes(old[k], new[k], (*path, k), derived=derived)
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) == len(new):
            pairs = enumerate(zip(old, new, strict=True))
            return [ln for i, (a, b) in pairs for ln in value_changes(a, b, (*path, i), derived=derived)]
        sm = difflib.SequenceMatcher(
            a=[json.dumps(x, sort_keys=True) for x in old], b=[json.dumps(x, sort_keys=True) for x in new]
        )
        out = []
        for op, i1, i2, j1, j2 in sm.get_opcodes():
            if op in ("delete", "replace"):
                out += [f"{_path((*path, i))}: - {_fmt(old[i])}" for i in range(i1, i2)]
            if op in ("insert", "replace"):
                out += [f"{_path((*path, j))}: + {_fmt(new[j])}" for j in range(j1, j2)]
        return out
    key = path[-1] if path else None
    a, b = _as_text(old, key), _as_text(new, key)
    if a is not None or b is not None:
        a, b = a or "", b or ""
        what = "base64 text" if key == "content" and isinstance(old, str) and "\n" not in old else "text"
        head = f"{_path(path)}: {what}, {len(a.encode())} → {len(b.encode())} bytes"
        if _HASH.sub("#", a) == _HASH.sub("#", b):
            return [DERIVED_MARK + head]  # only sha256s changed in it (a digest label in a script): derived
        body = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "base", "head", n=2, lineterm=""))
        return [head, *(BODY + ln for ln in body[2:])]
    da, db = (_b64_text(old), _b64_text(new)) if key == "content" else (None, None)
    if da is not None and db is not None:
        return [f"{_path(path)}: base64 of {_fmt(da)} → {_fmt(db)}"]
    return [f"{_path(path)}: {_fmt(old)} → {_fmt(new)}"]


def _added(value: Any, path: tuple) -> list[str]:
    text = _as_text(value, path[-1] if path else None)
    if text is not None:
        return [f"{_path(path)}: + text, {_digest(text)}"]
    return [f"{_path(path)}: + {_fmt(value)}"]


def _dependents(urn: str, resources: list[dict], gone: set[str]) -> list[str]:
    """Who depends on `urn` directly (a dependency edge or a child) and goes too (`gone`: replaced or deleted), a
    component with its resource count. A dependent that is only updated, or untouched, is not named."""
    children: dict[str, list[dict]] = {}
    for r in resources:
        children.setdefault(r["parent"], []).append(r)

    def size(u: str) -> int:
        return sum(1 + size(c["urn"]) for c in children.get(u, []))

    out = []
    for r in resources:
        if (urn in r["dependencies"] or r["parent"] == urn) and r["urn"] in gone:
            n = size(r["urn"])
            out.append(f"{r['name']} ({short_type(r['type'])}" + (f", {n} resources)" if n else ")"))
    if len(out) > MAX_LIST:
        out = out[:MAX_LIST] + [f"and {len(out) - MAX_LIST} more"]
    return out


def _host(r: dict) -> str:
    h = r["inputs"].get("host")
    return str(h.get("name") if isinstance(h, dict) else h or r["name"])


def reboots(base: list[dict], head: list[dict]) -> list[str]:
    """Plain sentences, one per host whose boot-time wish (HostReboot's expected running state) changes."""
    old = {r["urn"]: r for r in base if r["type"] == REBOOT_TYPE}
    out = []
    for r in head:
        if r["type"] != REBOOT_TYPE:
            continue
        o, n = old.get(r["urn"]), r["inputs"]
        never = n.get("policy") == "never"
        verb = "needs a reboot (`reboot: never`: reported as pending, not rebooted)" if never else "reboots"
        if o is None:
            out.append(
                f"{code(_host(r))} {verb}: new host, the first `up` reboots it once unless its running kernel already "
                "matches."
            )
            continue
        why = []
        for k in REBOOT_INPUTS:
            a, b = o["inputs"].get(k) or ([] if k != "expect_drivers" else {}), n.get(k) or []
            if a == b:
                continue
            if isinstance(a, list) and isinstance(b, list):
                word = "kernel argument" if k == "expect_args" else "kernel argument to remove"
                why += [f"{word} {code(x)} added" for x in b if x not in a]
                why += [f"{word} {code(x)} dropped" for x in a if x not in b]
            else:
                a, b = dict(a or {}), dict(b or {})
                why += [f"{code(d)} bound to {code(b[d])}" for d in sorted(b) if a.get(d) != b[d]]
                why += [f"{code(d)} given back to its host driver" for d in sorted(a) if d not in b]
        if why:
            drain = "" if never else " (its running VMs are shut down first and started again after)"
            out.append(f"{code(_host(r))} {verb}: {'; '.join(why)}{drain}.")
    return out


def steps(base: dict, head: dict) -> list[dict]:
    """What `up` would do, base → head, one step per resource that changes, in the head's order, deletes last:
    {"op": create | update | replace | delete, "urn", "old", "new" (the resources, None where absent),
    "replaces" (the inputs the provider replaces on)}. Whether a change is one, and a replacement, is the head's
    provider's answer (`verdicts`)."""
    bres = [] if base.get("error") else base.get("resources", [])
    hres = head.get("resources", [])
    old, new = {r["urn"]: r for r in bres}, {r["urn"] for r in hres}
    verdicts = head.get("verdicts", {})
    out = []
    for r in hres:
        o = old.get(r["urn"])
        if o is None:
            out.append({"op": "create", "urn": r["urn"], "old": None, "new": r, "replaces": []})
            continue
        v = verdicts.get(r["urn"])
        if o["inputs"] == r["inputs"] or (v is not None and not v["changes"]):
            continue
        replaces = (v or {}).get("replaces") or []
        out.append(
            {"op": "replace" if replaces else "update", "urn": r["urn"], "old": o, "new": r, "replaces": replaces}
        )
    out += [
        {"op": "delete", "urn": o["urn"], "old": o, "new": None, "replaces": []} for o in bres if o["urn"] not in new
    ]
    return out


def plan_digest(base: dict, head: dict) -> str | None:
    """sha256 over the plan's steps and their inputs (secret inputs masked), the same on every run of the same two
    commits; None when the head's config does not load (no plan). `plan_digest(base, head)` → "sha256:9f2c…"."""
    if head.get("error"):
        return None

    def masked(r: dict | None) -> dict | None:
        return {k: "[secret]" if k in r["secret"] else v for k, v in r["inputs"].items()} if r else None

    doc = {
        "stack": head.get("stack"),
        "steps": [
            {
                "op": s["op"],
                "urn": s["urn"],
                "replaces": s["replaces"],
                "old": masked(s["old"]),
                "new": masked(s["new"]),
            }
            for s in steps(base, head)
        ],
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def digest_line(stack: str, digest: str | None) -> str:
    """The comment's line the apply job on main reads back (tools.plan_check)."""
    if digest is None:
        return f"{DIGEST_HEAD} {code(stack)}: none (the head's config does not load: there is nothing to apply)."
    return f"{DIGEST_HEAD} {code(stack)}: `{digest}` (main's apply job recomputes it and refuses another plan)."


_WORDS = re.compile(r"[A-Za-z0-9 ,.;:()'/-]*")


def _words(text: Any) -> str:
    """A provider's own words as they are; anything else (it should hold no input value) as code."""
    return text if isinstance(text, str) and _WORDS.fullmatch(text) else code(text)


def _num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return code(v)
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def _load(load: dict) -> str:
    """A gate's load in words: connections, duration, requests, rate, what it must hold, where it goes."""
    size = f"{_num(load.get('connections'))} connections for {_num(load.get('duration_s'))} s"
    size += f", up to {_num(load.get('max_requests'))} requests"
    if load.get("rate_rps"):
        size += f" (open loop at {_num(load['rate_rps'])} requests/s)"
    slo = [f"{k} ≤ {_num(load[f'{k}_ms'])} ms" for k in ("p95", "p99") if load.get(f"{k}_ms")]
    if load.get("max_error_rate"):
        slo.append(f"errors ≤ {_num(load['max_error_rate'] * 100)} %")
    if load.get("min_rps"):
        slo.append(f"≥ {_num(load['min_rps'])} requests/s")
    return size + f" through {code(load.get('url'))}" + (f", must hold {', '.join(slo)}" if slo else "")


def _restarts(effects: list[dict]) -> str:
    by_host: dict[str, list[str]] = {}
    for e in effects:
        by_host.setdefault(e["host"], []).append(f"{code(e['what'])} {_words(e['how'])}")
    parts = [(f"on {code(h)}: " if h else "") + "; ".join(w) for h, w in by_host.items()]
    return ". ".join(parts) + "." if parts else "none."


def _replaced(r: dict, keys: list[str]) -> str:
    host = r["inputs"].get("host")
    where = f" on {code(host.get('name'))}" if isinstance(host, dict) else ""
    return f"{code(r['name'])} ({short_type(r['type'])}){where}: {', '.join(code(k) for k in keys)} changed"


def _head(plan: list[dict], head: dict, bres: list[dict], hres: list[dict]) -> list[str]:
    """The lines a 2 a.m. operator reads first: what reboots, restarts, runs a load against production, goes."""
    said = [(s, e) for s in plan for e in head.get("effects", {}).get(s["urn"], [])]
    gates = [e for _, e in said if e["kind"] == "gate"]
    gated = {s["urn"] for s, e in said if e["kind"] == "gate"}
    boots = reboots(bres, hres)
    out = ["- **Reboots:** " + (" ".join(boots) if boots else "none.")]
    out.append("- **Restarts:** " + _restarts([e for _, e in said if e["kind"] == "restart"]))
    runs = [f"{code(e['what'])} on {code(e['host'])}: {_load(e['load'])}; {_words(e['how'])}." for e in gates]
    out.append("- **Gates re-run:** " + (" ".join(runs) if runs else "none."))
    replaced = [
        _replaced(s["new"], s["replaces"])
        for s in plan
        if s["op"] == "replace" and s["urn"] not in gated  # a gate's replacement is its re-run, said above
    ]
    out.append("- **Replaced** (deleted, then created again): " + ("; ".join(replaced) + "." if replaced else "none."))
    return out


def _detail(s: dict) -> tuple[list[str], int]:
    """The changed input paths of an update or replacement, and how many derived ones were left out."""
    o, r = s["old"], s["new"]
    secret = set(r["secret"]) | set(o["secret"])
    derived = tuple(tuple(p) for p in r.get("derived") or ())
    lines = []
    for k in sorted(set(o["inputs"]) | set(r["inputs"])):
        if k not in ("version", "owner_tag"):
            lines += value_changes(o["inputs"].get(k), r["inputs"].get(k), (k,), k in secret, derived)
    shown = [ln for ln in lines if not ln.startswith(DERIVED_MARK)]
    return shown, len(lines) - len(shown)


def _diff_lines(plan: list[dict], head: dict, bres: list[dict], hres: list[dict]) -> tuple[list[str], int]:
    """The diff block's lines (`+`, `-`, `~`, `+-`), and how many derived values it leaves out."""
    gone = {s["urn"] for s in plan if s["op"] in ("replace", "delete")}
    verdicts = head.get("verdicts", {})
    lines: list[str] = []
    folded = 0
    for s in plan:
        r = s["new"] or s["old"]
        label = f"{r['name']} ({short_type(r['type'])})"
        if s["op"] in ("create", "delete"):
            lines.append(f"{'+' if s['op'] == 'create' else '-'} {label}: {s['op']}")
            dep = _dependents(r["urn"], bres, gone) if s["op"] == "delete" else []
            lines += [f"    depended on it: {', '.join(dep)}"] if dep else []
            continue
        detail, n = _detail(s)
        folded += n
        v = verdicts.get(s["urn"])
        notes = ["derived values only"] if n and not detail else []
        notes += [FOREIGN] if r["custom"] and not (v and v.get("rule")) else []
        note = f" ({'; '.join(notes)})" if notes else ""
        if s["op"] == "replace":
            lines.append(f"+- {label}: replace (the provider replaces on {', '.join(s['replaces'])}){note}")
        else:
            lines.append(f"~ {label}: update{note}")
        lines += [f"        {d[1:]}" if d.startswith(BODY) else f"    ~ {d}" for d in detail]
        dep = _dependents(r["urn"], hres, gone) if s["op"] == "replace" else []
        lines += [f"    depends on it, replaced too: {', '.join(dep)}"] if dep else []
    return lines, folded


def render(base: dict, head: dict, base_ref: str = "base", head_ref: str = "head") -> tuple[str, bool]:
    """Markdown for one stack: (text, whether the head's config loads). The disclaimer (DECLARED) is the comment's,
    once, above every stack (`main`)."""
    stack = head.get("stack") or base.get("stack")
    out = [f"### {code(stack)}: {base_ref} → {head_ref}", ""]
    if head.get("error"):
        out += [digest_line(str(stack), None), ""]
        out += ["The head's stack config is refused by the loader, before any resource:", "", *block(head["error"]), ""]
        return "\n".join(out) + "\n", False
    if head.get("absent"):
        out += [
            f"{code(f'Pulumi.{stack}.yaml')} is deleted at the head: every resource of the stack would be destroyed."
        ]
        out += [""]
    if base.get("error"):
        out += ["The base's stack config did not load (shown as all created):", "", *block(base["error"]), ""]
    bres = [] if base.get("error") else base.get("resources", [])
    hres = head.get("resources", [])
    plan = steps(base, head)
    digest = digest_line(str(stack), plan_digest(base, head))
    if not plan:
        out += [f"**No changes** ({len(hres)} resources unchanged).", "", digest, ""]
        return "\n".join(out) + "\n", True
    lines, folded = _diff_lines(plan, head, bres, hres)
    counts = {k: sum(1 for s in plan if s["op"] == k) for k in ("create", "update", "replace", "delete")}
    same = len(hres) - counts["create"] - counts["update"] - counts["replace"]
    note = f" (derived: {folded} values, not listed: hashes that follow the lines shown)" if folded else ""
    summary = ", ".join(f"{n} to {k}" for k, n in counts.items() if n) + f", {same} unchanged{note}."
    # The digest before the diff block: a comment cut at GitHub's size limit still holds it (main's apply job reads
    # it back).
    out += [*_head(plan, head, bres, hres), "", digest, "", summary, "", *block(lines, "diff"), ""]
    return "\n".join(out) + "\n", True


def main(argv: list[str]) -> int:
    if argv[:1] == ["--snapshot"]:
        stack, key, against, out = argv[1:5]
        against_doc = json.loads(Path(against).read_text()) or None
        Path(out).write_text(json.dumps(snapshot(stack, Path(key).read_text(), against_doc), sort_keys=True))
        return 0
    if argv[:1] == ["--declared"]:
        ok = True
        for stack in argv[1:] or ["hk-prod"]:
            text, good = declared(stack)
            sys.stdout.write(text)
            ok = ok and good
        return 0 if ok else 1
    ap = argparse.ArgumentParser(prog="python -m tools.plan_diff", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="base commit (the PR's target)")
    ap.add_argument("--head", default="HEAD", help="head commit (the PR, merged or not)")
    ap.add_argument("--repo", default=".", help="git repository holding both commits")
    ap.add_argument("stacks", nargs="*", help="stack names (default: every Pulumi.<stack>.yaml at either commit)")
    a = ap.parse_args(argv)
    repo = Path(a.repo)
    refs = [git(repo, "rev-parse", "--short", c) for c in (a.base, a.head)]
    ok = True
    sys.stdout.write(DECLARED + "\n\n")  # once, above every stack
    for b, h in plan_commits(repo, a.base, a.head, a.stacks or None):
        where = (f"base {code(refs[0])}", f"head {code(refs[1])}")
        try:
            text, good = render(b, h, *where)
        except Exception as e:  # noqa: BLE001 - the other stacks' diffs are still written
            bad = {"stack": h.get("stack") or b.get("stack"), "error": [f"rendering failed: {type(e).__name__}: {e}"]}
            text, good = render({}, bad, *where)
        sys.stdout.write(text)
        sys.stdout.flush()
        ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    if __package__ in (None, ""):
        # Run as a file inside a planned tree: import that tree's code, not this script's folder's.
        sys.path[0] = os.getcwd()
    raise SystemExit(main(sys.argv[1:]))
