"""What a stack declares, from the program run under Pulumi mocks: every resource and its inputs, with no secret.
(What a pull request changes, base against head, is tools/plan_diff.py, which the PR workflow runs.)

It is not a `pulumi preview`: no refresh, no host is contacted, no provider `check` runs (preflight included), and
the stack's secrets are replaced by a throwaway key (tests/stackfiles.py). It does run the whole stack loader, so a
bad config fails here with its one-line-per-field errors, and it lists every resource with the inputs preview would
show. The real preview runs on main, from the management network, before `up` (.github/workflows/up.yml).

Usage::

    .venv/bin/python -m tools.mock_plan hk-prod >> "$GITHUB_STEP_SUMMARY"
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from tests.mocks import attempt_program
from tests.stackfiles import stack_config

HIDDEN = ("__provider", "host", "prior")


def render(stack: str) -> tuple[str, bool]:
    cfg, secret = stack_config(stack)
    rec, err = attempt_program(cfg, secret, stack=stack)
    out = [f"### `{stack}`: declared resources (Pulumi mocks: no refresh, hosts not contacted, no secrets)", ""]
    if err is not None:
        out += ["```", str(err), "```"]
        return "\n".join(out) + "\n", False
    counts = Counter(r.type for r in rec.registrations)
    out += ["| type | count |", "| --- | --- |"] + [f"| `{t}` | {n} |" for t, n in sorted(counts.items())]
    out += ["", "<details><summary>inputs per resource</summary>", "", "```"]
    for r in rec.registrations:
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
