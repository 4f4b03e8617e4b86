"""Run the Pulumi program against a resource monitor, the way the Python language host does.

Started by `tools.driver` as `<project>/.venv/bin/python -u tools/driver/langhost.py --monitor ... .` with the project
root as working directory. Like the real exec script (pulumi/pulumi sdk/python/cmd/pulumi-language-python-exec),
it takes the stack config from PULUMI_CONFIG / PULUMI_CONFIG_SECRET_KEYS, configures the runtime's Settings, and
runs the program directory with runpy: `run_path(".")` is what puts the project root on sys.path, so the program's
imports work through the working directory, not PYTHONPATH.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import runpy
import sys
from concurrent.futures import ThreadPoolExecutor


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag in ("--project", "--stack", "--monitor", "--engine", "--organization", "--root_directory"):
        ap.add_argument(flag)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--dry_run", default="false")
    ap.add_argument("program")
    a = ap.parse_args()

    import pulumi
    import pulumi.runtime

    pulumi.runtime.set_all_config(pulumi.runtime.get_config_env(), pulumi.runtime.get_config_secret_keys_env())
    pulumi.runtime.configure(
        pulumi.runtime.Settings(
            monitor=a.monitor,
            engine=a.engine,
            project=a.project,
            stack=a.stack,
            parallel=a.parallel,
            dry_run=a.dry_run == "true",
            organization=a.organization or "organization",
            root_directory=a.root_directory,
        )
    )
    sys.argv = [a.program]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # As the exec script: the SDK's blocking RPCs run in the default executor, sized from --parallel.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=max(a.parallel, 1) * 4))
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    try:

        def program() -> None:
            runpy.run_path(a.program, run_name="__main__")

        loop.run_until_complete(pulumi.runtime.run_in_stack(program))
    except Exception as e:  # noqa: BLE001 -- the driver shows the program's error; the details went to the engine log
        from pulumi.errors import RunError

        if not isinstance(e, RunError):
            import traceback

            traceback.print_exc()
        else:
            print(f"error: {e}", file=sys.stderr)
        return 32
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
