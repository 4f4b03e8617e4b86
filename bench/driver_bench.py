"""Host prep through the deployment driver (tools/driver: the engine's parallel steps) vs the Ansible playbook.

    .venv/bin/python -m bench.driver_bench                  # both phases (~15 min on 2 TCG cores)
    .venv/bin/python -m bench.driver_bench --only gpuhost   # or --only ansible; --keep merges into the last results

Each phase boots a fresh copy-on-write overlay of the cached base image (tests/testhost). gpuhost: a one-host stack
(the same PassthroughHost values as bench/run.py, tests/test_passthrough_host.py::host_config) run by
`tools.driver.Driver.up()`, as `pulumi up` would: the program registers every resource, each step runs as soon as
its dependencies are done. Every step's start and duration come from the driver's own step records
(`Plan.steps`); "excluding the reboot" is the time from the start of the `up` to the start of the HostReboot step
(the reboot decision), as bench/run.py takes Ansible's time from its reboot-decision task. A no-op `up` follows.
Ansible: bench/run.py's ansible phase (first apply of bench/ansible/host_prep.yml only).

Writes bench/results/driver.json and the table between the BEGIN/END driver markers of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import DOC, RESULTS, ROOT, RoundTripLog, boot, boots_seen, log, machine

BEGIN, END = "<!-- BEGIN bench/driver_bench.py table -->", "<!-- END bench/driver_bench.py table -->"
PASSPHRASE = "bench"


def one_host_stack(th) -> tuple:
    """StackConfig for a fleet of one host: PassthroughHost with bench/run.py's values, the run's key as secret."""
    from tests.test_passthrough_host import host_config
    from tools.driver import StackConfig

    host = host_config(th).model_dump(mode="json", exclude_none=True)
    cfg = StackConfig({}, []).with_values(fleet={"hosts": [host]}, sshPrivateKey=th.private_key_pem)
    cfg.secret_keys.append("gpuhost:sshPrivateKey")
    return cfg, host["name"]


def step_records(plan, t_start: float) -> list[dict]:
    """Every custom resource's step: offset from the start of the `up`, duration, operation."""
    out = []
    for s in plan.steps:
        if not s.started:
            continue
        out.append(
            {
                "name": s.name,
                "type": s.type.rsplit(":", 1)[-1],
                "op": s.op,
                "start_s": round(s.started - t_start, 2),
                "seconds": round(s.seconds, 2),
                "error": s.error,
            }
        )
    return sorted(out, key=lambda r: r["start_s"])


def gpuhost_phase(out: dict, work: Path) -> dict:
    import os

    from tools.driver import Driver

    th = boot(work, "driver-a")
    try:
        cfg, name = one_host_stack(th)
        rtlog = RoundTripLog(work / "driver-roundtrips.log", name)
        rtlog.reset()
        os.environ["GPUHOST_ROUNDTRIP_LOG"] = str(rtlog.path)  # the driver's provider process inherits it
        state = work / "driver-state.json"
        with open(work / "driver-up.log", "w") as plan_out:
            d = Driver(ROOT, "bench", passphrase=PASSPHRASE, config=cfg, state=state, out=plan_out)
            log("gpuhost (driver): first up")
            t0 = time.monotonic()
            up = d.up()
            wall = time.monotonic() - t0
            if up.errors:
                raise RuntimeError(f"up failed: {up.errors}")
            steps = step_records(up, t0)
            reboot = next(s for s in steps if s["type"] == "HostReboot")
            prep = [s for s in steps if s["type"] != "HostReboot" and s["start_s"] < reboot["start_s"]]
            out["apply"] = {
                "total_s": wall,
                "plan_seconds": up.seconds,
                "excluding_reboot_s": reboot["start_s"],
                "reboot_resource_s": wall - reboot["start_s"],
                "reboot_step_s": reboot["seconds"],
                "host_prep_steps_sum_s": sum(s["seconds"] for s in prep),
                "first_step_start_s": min(s["start_s"] for s in steps),
                "steps": steps,
                "roundtrips": rtlog.count(),
                "reboots_serial": boots_seen(th) - 1,
                "resources": len(steps),
                "counts": up.counts(),
            }
            log(f"gpuhost (driver): up {wall:.0f} s, reboot decision at {reboot['start_s']:.0f} s")
            rtlog.reset()
            t0 = time.monotonic()
            noop = d.up()
            out["noop"] = {
                "wall_s": time.monotonic() - t0,
                "changes": noop.changes(),
                "counts": noop.counts(),
                "roundtrips": rtlog.count(),
                "errors": noop.errors,
            }
            log(f"gpuhost (driver): no-op up {out['noop']['wall_s']:.0f} s, {noop.changes()} changes")
        os.environ.pop("GPUHOST_ROUNDTRIP_LOG", None)
        out["reboots_serial_end"] = boots_seen(th) - 1
    finally:
        th.stop()
    return out


def ansible_phase(out: dict, work: Path) -> dict:
    from bench import run

    run.ansible_phase(out, work, 0)  # first apply only (no-op and drift: bench/run.py)
    return out


def table(r: dict) -> str:
    m = r["machine"]
    g, a = r.get("gpuhost", {}), r.get("ansible", {})
    lines = [
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), emulated host under {m['accel'].upper()}, load average at "
        f"start of each phase: gpuhost {' '.join(g.get('machine', {}).get('loadavg_start', ['?']))}, ansible "
        f"{' '.join(a.get('machine', {}).get('loadavg_start', ['?']))} (shared with other work); {m['date']}; "
        f"gpuhost at commit {g.get('commit', '?')}, ansible at commit {a.get('commit', '?')}.",
        "",
        "| First apply of host prep, fresh overlay | gpuhost via tools/driver | Ansible host_prep.yml | "
        "Ansible ÷ gpuhost | Target |",
        "|---|---|---|---|---|",
    ]
    ga, aa = g.get("apply"), a.get("apply")
    if ga and aa:
        ratio = aa["excluding_reboot_s"] / ga["excluding_reboot_s"]
        lines += [
            f"| Excluding the reboot (to the reboot decision) | {ga['excluding_reboot_s']:.0f} s | "
            f"{aa['excluding_reboot_s']:.0f} s | {ratio:.1f}× | ≥ 3× |",
            f"| Total incl. reboot | {ga['total_s']:.0f} s | {aa['total_s']:.0f} s | "
            f"{aa['total_s'] / ga['total_s']:.1f}× | – |",
            f"| SSH round trips | {ga['roundtrips']} | {aa['roundtrips']} | – | – |",
            f"| Reboots (serial console kernel starts − 1) | {ga['reboots_serial']} | {aa['reboots_serial']} | – | 1 |",
        ]
    if g.get("noop"):
        lines.append(
            f"| No-op `up` right after (preview + up, {g['noop']['changes']} changes) | {g['noop']['wall_s']:.0f} s, "
            f"{g['noop']['roundtrips']} round trips | – | – | 0 changes |"
        )
    if ga:
        lines += ["", "gpuhost's steps as the driver ran them (seconds from the start of the `up`):", ""]
        lines += ["| Step | Resource | Starts at | Takes |", "|---|---|---|---|"]
        for s in ga["steps"]:
            lines.append(f"| {s['name']} | {s['type']} ({s['op']}) | {s['start_s']:.1f} s | {s['seconds']:.1f} s |")
    return "\n".join(lines) + "\n"


def write(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "driver.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    md = table(results)
    (RESULTS / "driver.md").write_text(md)
    text = DOC.read_text()
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        _, post = rest.split(END, 1)
        DOC.write_text(pre + BEGIN + "\n" + md + END + post)
    else:
        DOC.write_text(text.rstrip("\n") + "\n\n" + BEGIN + "\n" + md + END + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.driver_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="gpuhost,ansible", help="phases, comma-separated")
    ap.add_argument("--keep", action="store_true", help="merge into the existing bench/results/driver.json")
    a = ap.parse_args(argv)
    results: dict = {}
    if a.keep and (RESULTS / "driver.json").exists():
        results = json.loads((RESULTS / "driver.json").read_text())
    here = machine()
    results.setdefault("machine", here)
    work = Path(tempfile.mkdtemp(prefix="gpuhost-driver-bench-"))
    log(f"work dir {work}")
    runs = {"gpuhost": lambda o: gpuhost_phase(o, work), "ansible": lambda o: ansible_phase(o, work)}
    for phase in ("gpuhost", "ansible"):
        if phase not in a.only.split(","):
            continue
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        results[phase] = {
            "commit": commit.stdout.strip(),
            "machine": {**here, "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]},
        }
        try:
            runs[phase](results[phase])
        except Exception:
            import traceback

            results[phase]["error"] = traceback.format_exc()
            log(f"{phase} phase failed:\n{results[phase]['error']}")
        write(results)
    print((RESULTS / "driver.md").read_text())
    sys.exit(1 if any("error" in results.get(p, {}) for p in ("gpuhost", "ansible")) else 0)


if __name__ == "__main__":
    main()
