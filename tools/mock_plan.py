"""What a stack declares, from the program run under Pulumi mocks: every resource and its inputs, with no secret.
(What a pull request changes, base against head, is tools/plan_diff.py, which the PR workflow runs.)

It is not a `pulumi preview`: no refresh, no host is contacted, no provider `check` runs (preflight included), and
the stack's secrets are replaced by one fixed, public throwaway key (`PLAN_KEY`: derived from a constant, so what
derives from it, such as the guests' authorized key, is the same on every run). It does run the whole stack loader, so a
bad config fails here with its one-line-per-field errors, and it lists every resource with the inputs preview would
show. The real preview runs on main, from the management network, before `up` (.github/workflows/up.yml).

Usage::

    .venv/bin/python -m tools.mock_plan hk-prod >> "$GITHUB_STEP_SUMMARY"
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from testbed.mocks import attempt_program
from testbed.stackfiles import stack_config

HIDDEN = ("__provider", "host", "prior")
# Not a secret: a key every run derives the same way, so two runs of one tree print the same bytes.
PLAN_KEY = (
    Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"gpuhost mock plan: public throwaway key").digest())
    .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    .decode()
)


def render(stack: str) -> tuple[str, bool]:
    cfg, secret = stack_config(stack)
    for k in secret:
        cfg[k] = PLAN_KEY
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


def main(argv: list[str]) -> int:
    ok = True
    for stack in argv or ["hk-prod"]:
        text, good = render(stack)
        sys.stdout.write(text)
        ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
