"""`python -m tools.driver preview|up|refresh|destroy [--stack dev]`: run a stack through the driver."""

from __future__ import annotations

import argparse
import sys

from tools.driver.engine import Driver


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.driver")
    ap.add_argument("operation", choices=["preview", "up", "refresh", "destroy"])
    ap.add_argument("--stack", default="dev")
    ap.add_argument("--parallel", type=int, default=16, help="steps applied at once (1: one at a time)")
    ap.add_argument("--continue-on-error", action="store_true", help="a failed step skips only its dependents")
    a = ap.parse_args()
    if a.parallel < 1:
        ap.error(f"--parallel {a.parallel}: write 1 or more (1 applies one step at a time)")
    d = Driver(stack=a.stack, parallel=a.parallel, continue_on_error=a.continue_on_error)
    outcome = getattr(d, a.operation)()
    return 1 if outcome.errors else 0


if __name__ == "__main__":
    sys.exit(main())
