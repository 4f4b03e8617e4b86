"""What a host had before gpuhost touched it, kept on the host and in state, so delete restores it byte for byte.

The first time any gpuhost resource is about to change a file, the file (or the fact that it was absent) is copied
to /var/lib/gpuhost/pristine/<path> with its mode and owner (`cp -a`). Later attempts — a re-run after the host
dropped the connection mid-apply, say — find the copy and keep it, so the recorded "before" is never a half-applied
state. Delete restores from the recorded state and then forgets the copy.

Usage (inside a provider)::

    text = capture_script(paths) + facts_script(...)      # one round trip: capture + read
    prior = parse_files(out, section="pristine")          # {path: FileState}
    conn.run(restore_script(prior))                        # on delete
"""

from __future__ import annotations

from typing import Iterable

from access.shell import Script, quote
from facts.files import FileState

ROOT = "/var/lib/gpuhost/pristine"


def _copy(path: str) -> str:
    return ROOT + path


def capture_script(paths: Iterable[str], script: Script | None = None) -> Script:
    s = script or Script()
    for p in paths:
        c, q = quote(_copy(p)), quote(p)
        a = quote(_copy(p) + ".absent")
        s.raw(
            f'if [ ! -e {c} ] && [ ! -e {a} ]; then mkdir -p "$(dirname {c})"; '
            f"if [ -f {q} ]; then cp -a {q} {c}; else : > {a}; fi; fi"
        )
        s.raw(f"echo '@@pristine' {q}")
        s.raw(f"if [ -f {c} ]; then stat -c '%a %u %g' {c}; base64 -w0 {c}; echo; else echo ABSENT; fi")
    return s


def write_lines(path: str, content: bytes, mode: str, owner: str) -> list[str]:
    """Shell lines writing `content` atomically to `path` with mode/owner (content inlined as quoted base64)."""
    import base64

    b64 = base64.b64encode(content).decode()
    return [
        f"tmp=$(mktemp {quote(path + '.gpuhost.XXXXXX')})",
        f"printf '%s' {quote(b64)} | base64 -d > \"$tmp\"",
        f'chmod {quote(mode)} "$tmp"',
        f'chown {quote(owner)} "$tmp"',
        'sync "$tmp"',
        f'mv -f "$tmp" {quote(path)}',
    ]


def restore_lines(prior: dict[str, FileState]) -> list[str]:
    """Lines putting every recorded file back exactly (or removing it), then forgetting the pristine copies."""
    lines: list[str] = []
    for path, st in sorted(prior.items()):
        if st.exists:
            lines += write_lines(path, st.content, st.mode.zfill(4), f"{st.uid}:{st.gid}")
        else:
            lines.append(f"rm -f -- {quote(path)}")
        lines.append(f"rm -f -- {quote(_copy(path))} {quote(_copy(path) + '.absent')}")
    return lines


def restore_script(prior: dict[str, FileState]) -> str:
    return Script().raw("set -e").extend(restore_lines(prior)).render()


def capture_and_read(conn, paths: Iterable[str], sysctls: Iterable[str] = (), files: Iterable[str] = ()):
    """One round trip: record pristine copies of `paths` (first time only) and read the host's facts.

    Returns (HostFacts, {path: FileState as it was before gpuhost}).
    """
    from facts.files import parse_files
    from facts.host import facts_script, parse_host_facts, split_sections

    paths = list(paths)
    s = Script().raw("echo @@pristine-files")
    capture_script(paths, s)
    out = conn.run(s.render() + facts_script(sysctls, list(files) + paths)).stdout
    pristine = parse_files(split_sections(out).get("pristine-files", ""), section="pristine")
    return parse_host_facts(out), pristine
