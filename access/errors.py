"""The one error a provider raises: which host, what went wrong, how to fix it, whether anything changed.

`pulumi up` shows the message as is, so it reads as one paragraph an operator can act on at 2 a.m.; the failing
command's stderr (its last 2,000 characters) comes last.

Usage::

    raise HostError("gpu-a", "unknown sysctl net.core.somaxconm on this kernel", fix="check the name",
                    changed=False)
"""

from __future__ import annotations


class HostError(RuntimeError):
    def __init__(self, host: str, problem: str, fix: str = "", changed: bool | None = False, stderr: str = ""):
        self.host, self.problem, self.fix, self.changed, self.stderr = host, problem, fix, changed, stderr
        state = {
            False: "nothing was changed",
            True: "the host was partly changed; a re-run continues from there",
            None: "whether the host was changed is not known (the connection was lost); a re-run converges",
        }[changed]
        msg = f"{host}: {problem}; {state}"
        if fix:
            msg += f". Fix: {fix}"
        if stderr.strip():
            msg += f"\nstderr: {stderr.strip()[-2000:]}"
        super().__init__(msg)
