"""Apply only what was reviewed: before `pulumi up` on main, recompute the stack's plan digest (tools/plan_diff: the
steps base → head and their inputs, secrets masked) and refuse when it is not the one the merged pull request's
plan comment showed.

`--base` is the commit the stack was last applied from (the workflow keeps it as a stack tag), `--head` the commit
to apply. The digest to match comes from the comment (`--comment`, the bot's Markdown, which prints one
"**Plan digest** of `stack`: `sha256:…`" line per stack) or, for a run by hand after reading a plan, `--expect`.

Usage (what .github/workflows/up.yml runs)::

    .venv/bin/python -m tools.plan_check hk-prod --base "$APPLIED" --head "$GITHUB_SHA" --comment comment.md --pr 17
    .venv/bin/python -m tools.plan_check hk-prod --base "$APPLIED" --head "$GITHUB_SHA" --expect sha256:9f2c…

Exit status 0: the plan is the reviewed one (one line says so). 3: refused; the message names the stack, both
digests, why it can happen and what to do, then the plan as it is now. 2: wrong arguments.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tools import plan_diff

REFUSED = 3
_DIGEST = re.compile(r"`(sha256:[0-9a-f]{64})`")


def shown_digest(comment: str, stack: str) -> str | None:
    """The digest the comment shows for `stack` ("none" when it showed a config that does not load), None when it
    shows none. Only lines outside code blocks count: a diff line that reads like one is PR text, not the bot's."""
    prefix = f"{plan_diff.DIGEST_HEAD} {plan_diff.code(stack)}: "
    fence = ""
    found = None
    for line in comment.splitlines():
        run = re.match(r"`{3,}", line)
        if fence:
            if run and len(run.group()) >= len(fence) and not line[run.end() :].strip():
                fence = ""
            continue
        if run:
            fence = run.group()
        elif line.startswith(prefix):
            rest = line[len(prefix) :]
            m = _DIGEST.match(rest)
            found = m.group(1) if m else "none" if rest.startswith("none") else found
    return found


def refusal(stack: str, refs: tuple[str, str], now: str | None, shown: str | None, source: str) -> str:
    """Why `up` stops, and what to do, in plain words."""
    where = f"base {refs[0]} → head {refs[1]}"
    if now is None:
        return (
            f"REFUSED: {stack} is not applied: its config at {refs[1]} does not load, so there is no plan to apply.\n"
            "What to do: fix the stack file in a pull request; its plan comment shows the loader's lines."
        )
    if shown is None:
        what = f"{source} shows no plan digest for {stack}"
        why = "no merged pull request was found for this commit, or its plan comment was never posted or was cut"
    elif shown == "none":
        what, why = f"{source} showed {stack}'s config as not loading", "the reviewed head did not plan at all"
    else:
        what = f"{source} showed {shown}"
        why = (
            "the plan changed after it was reviewed: another change to this stack landed between that preview and "
            "this apply, an earlier apply of main failed or was refused (the base is the last applied commit), or "
            "the last push to the pull request was not previewed"
        )
    return (
        f"REFUSED: {stack} is not applied. Its plan on main ({where}) has digest {now}; {what}.\n"
        f"Why this happens: {why}.\n"
        "What to do: read the plan below. To apply exactly it, run the up workflow by hand with it:\n"
        f"  gh workflow run up.yml -f stack={stack} -f plan_digest={now}\n"
        "or open a pull request that brings main to what you want applied."
    )


def check(stack: str, base_plan: dict, head_plan: dict, shown: str | None, source: str, refs: tuple[str, str]):
    """(ok, message): whether the plan base → head is the one `shown` (a digest, "none" or None)."""
    now = plan_diff.plan_digest(base_plan, head_plan)
    if now is not None and now == shown:
        return True, f"{stack}: the plan on main ({refs[0]} → {refs[1]}) is the one {source} showed ({now})."
    return False, refusal(stack, refs, now, shown, source)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.plan_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("stack")
    ap.add_argument("--base", required=True, help="the commit the stack was last applied from")
    ap.add_argument("--head", default="HEAD", help="the commit to apply")
    ap.add_argument("--repo", default=".", help="git repository holding both commits")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--comment", type=Path, help="the merged pull request's plan comment (Markdown; may be empty)")
    src.add_argument("--expect", help="the digest a person read in a plan (a run by hand)")
    ap.add_argument("--pr", default="", help="the pull request's number, for the message")
    a = ap.parse_args(argv)
    repo = Path(a.repo)
    refs = (plan_diff.git(repo, "rev-parse", "--short", a.base), plan_diff.git(repo, "rev-parse", "--short", a.head))
    if a.expect is not None:
        shown, source = a.expect.strip(), "the digest given by hand"
    else:
        text = a.comment.read_text() if a.comment.exists() else ""
        shown = shown_digest(text, a.stack)
        source = f"pull request #{a.pr}'s plan comment" if a.pr else "the pull request's plan comment"
    base_plan, head_plan = next(plan_diff.plan_commits(repo, a.base, a.head, [a.stack]))
    ok, message = check(a.stack, base_plan, head_plan, shown, source, refs)
    print(message)
    if ok:
        return 0
    where = (f"base {plan_diff.code(refs[0])}", f"head {plan_diff.code(refs[1])}")
    print("\nThe plan as it is now:\n\n" + plan_diff.render(base_plan, head_plan, *where)[0])
    return REFUSED


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
