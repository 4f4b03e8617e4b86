#!/usr/bin/env bash
# Apply only what was reviewed (tools/plan_check.py), run by up.yml before its preview and again before `pulumi up`:
# the stack's plan from the commit it was last applied from to this one must be the one the merged pull request's
# plan comment showed (its "Plan digest" line), or the digest a person gives by hand (PLAN_DIGEST). Exit 3: refused.
#
# Env: STACK; GITHUB_REPOSITORY, GITHUB_SHA; BEFORE (the push's previous main, used until the stack has the tag);
# PLAN_DIGEST (a run by hand, else empty); GH_TOKEN (pull-requests: read); PULUMI_ACCESS_TOKEN (the stack tag
# gpuhost:applied-commit, which the up job sets after each successful `pulumi up`).
set -euo pipefail
applied=$(pulumi stack tag get gpuhost:applied-commit --stack "$STACK" 2>/dev/null || true)
if [ -z "$applied" ]; then
  applied=${BEFORE:-}
  echo "$STACK has no gpuhost:applied-commit tag yet: its plan is taken from the push's previous main, ${applied:-none}"
fi
if [ -z "$applied" ] || [ -z "${applied//0/}" ]; then
  echo "REFUSED: $STACK is not applied: no commit it was last applied from (no stack tag, no previous push)." >&2
  echo "What to do: after checking the hosts, record it: pulumi stack tag set gpuhost:applied-commit <sha> --stack $STACK" >&2
  exit 3
fi
if [ -n "${PLAN_DIGEST:-}" ]; then
  exec .venv/bin/python -m tools.plan_check "$STACK" --base "$applied" --head "$GITHUB_SHA" --expect "$PLAN_DIGEST"
fi
# The pull request merged as this commit, and the plan comment that preview.yml's bot wrote there (only the bot's:
# anyone can post a comment that starts with the marker).
pr=$(gh api "repos/$GITHUB_REPOSITORY/commits/$GITHUB_SHA/pulls" --jq '[.[] | select(.merged_at != null)][0].number // empty')
mark='<!-- gpuhost plan-diff -->'
: > plan-comment.md
if [ -n "$pr" ]; then
  id=$(gh api "repos/$GITHUB_REPOSITORY/issues/$pr/comments" --paginate \
         --jq ".[] | select(.user.login == \"github-actions[bot]\" and .user.type == \"Bot\")
               | select(.body | startswith(\"$mark\")) | .id" | tail -n 1)
  if [ -n "$id" ]; then
    gh api "repos/$GITHUB_REPOSITORY/issues/comments/$id" --jq .body > plan-comment.md
  fi
fi
exec .venv/bin/python -m tools.plan_check "$STACK" --base "$applied" --head "$GITHUB_SHA" --comment plan-comment.md --pr "$pr"
