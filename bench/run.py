"""gpuhost vs an idiomatic Ansible playbook on the same emulated GPU server, plus the pure/mocked benchmarks.

    .venv/bin/python -m bench.run                 # everything (~40 min on 2 TCG cores): results in bench/results/
    .venv/bin/python -m bench.run --only pure     # placement + 100-host mocks only (no emulated host)
    .venv/bin/python -m bench.run --only gpuhost,ansible --n 3 --n-ansible 3

Writes bench/results/results.json (every raw sample), bench/results/results.md (the table) and copies the table
into docs/benchmarks.md between its BEGIN/END markers. Not part of the test suite.

Phases (each host phase boots a fresh copy-on-write overlay of the same cached base image):
  gpuhost  host A: facts (gpuhost and `ansible -m setup` interleaved on the fresh host), first apply of
           PassthroughHost's own children (components.passthrough_host.children) through the SDK's provider server, no-op runs,
           drift after a hand edit of /etc/default/grub.
  ansible  host B: first apply of bench/ansible/host_prep.yml, no-op runs, drift (`--check --diff`); then the files
           both tools wrote are compared.
  pure     the placement solver on 1,000 hosts x 8 VMs; the whole program under Pulumi mocks for 100 hosts, beside
           the SDK's mock runtime alone (bench/mocks_floor.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- BEGIN bench/run.py table -->", "<!-- END bench/run.py table -->"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def stats(samples: Sequence[float]) -> dict:
    s = sorted(samples)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "n": len(s), "samples": samples} if s else {}


# ------------------------------------------------------------------------------------------------- machine


def machine() -> dict:
    from testbed.testhost.machine import accel

    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    mem = next(
        (ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")), "0"
    )
    ans = subprocess.run(["ansible", "--version"], capture_output=True, text=True).stdout.splitlines()
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(int(mem) / 2**20, 1),
        "accel": accel(),
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
        "python": platform.python_version(),
        "ansible": ans[0] if ans else "?",
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


# ------------------------------------------------------------------------------------------------- hosts


def boot(workdir: Path, name: str):
    from testbed.testhost.image import ensure_image
    from testbed.testhost.machine import SshKey, TestHost

    key = SshKey.generate(workdir / "key")
    th = TestHost(ensure_image(), workdir / name, key, name=name)
    th.start()  # fresh overlay
    log(f"{name} up in {th.timings['boot_s']} s (serial log {th.serial_log})")
    return th


def boots_seen(th) -> int:
    """Kernel starts on the serial console since this overlay's first boot (reboots = this minus 1)."""
    return th.serial_log.read_text(errors="replace").count("Linux version")


def host_files(th) -> dict[str, str | None]:
    """Text of every file PassthroughHost manages (None when absent), in one round trip."""
    from testbed.testhost.passthrough import WATCHED

    out = th.ssh(
        "for f in " + " ".join(WATCHED) + '; do echo "@@@ $f"; if [ -e "$f" ]; then cat "$f"; '
        "else echo @@@absent; fi; done"
    ).stdout
    files: dict[str, str | None] = {}
    for chunk in out.split("@@@ ")[1:]:
        path, _, body = chunk.partition("\n")
        files[path] = None if body.startswith("@@@absent") else body
    return files


class RoundTripLog:
    """GPUHOST_ROUNDTRIP_LOG for the provider-server process: access.ssh appends the host name per SSH exec."""

    def __init__(self, path: Path, host: str):
        self.path, self.host = path, host

    def reset(self) -> None:
        self.path.write_text("")

    def count(self) -> int:
        return sum(1 for ln in self.path.read_text().splitlines() if ln == self.host)


def provider_server(th, rtlog: RoundTripLog):
    """A fresh `python -m pulumi.dynamic` (what each `pulumi up` starts) that logs round trips to rtlog."""
    from testbed.provider_server import ProviderServer

    os.environ["GPUHOST_ROUNDTRIP_LOG"] = str(rtlog.path)
    # host_config(th) names the key "sshPrivateKey", the stack's secret config key
    srv = ProviderServer({"gpuhost:sshPrivateKey": th.private_key_pem})
    srv.__enter__()
    _SERVERS.append(srv)
    os.environ.pop("GPUHOST_ROUNDTRIP_LOG", None)  # only the server process logs; the bench's own checks do not
    return srv


_SERVERS: list = []


def stop_servers() -> None:
    while _SERVERS:
        try:
            _SERVERS.pop().__exit__(None, None, None)
        except Exception:
            pass


def rebind(flow, srv) -> None:
    for r in flow.res.values():
        r.server = srv


# ------------------------------------------------------------------------------------------------- gpuhost


def facts_phase(th, work: Path, n_gpuhost: int, n_ansible: int) -> dict:
    from access import ssh
    from bench.ansible_driver import AnsibleRun
    from facts.host import read_host_facts

    ans = AnsibleRun(work / "ansible-facts", th)
    spec = th.host_spec()
    keyfile = th.private_key_path
    g_in, g_cold, a_wall, a_rt, g_rt, g_cold_rt = [], [], [], [], [], []
    nfacts = None
    for i in range(max(n_gpuhost, n_ansible)):
        if i < n_gpuhost:
            ssh.drop(spec)
            before = ssh.ROUNDTRIPS.total
            t0 = time.monotonic()
            read_host_facts(ssh.connect(spec))  # connection included, as a fresh provider process pays it
            g_in.append(time.monotonic() - t0)
            g_rt.append(ssh.ROUNDTRIPS.total - before)
            t0 = time.monotonic()
            p = subprocess.run(
                [sys.executable, "-m", "bench.gpuhost_facts", spec.model_dump_json(), str(keyfile)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            g_cold.append(time.monotonic() - t0)  # interpreter start + imports + connect + read, like `ansible`
            cold = json.loads(p.stdout)
            g_cold_rt.append(cold["roundtrips"])
        if i < n_ansible:
            w, rt, nfacts = ans.adhoc_setup()
            a_wall.append(w)
            a_rt.append(rt)
    vvv, wrapped = ans.count_vvv()
    ssh.drop(spec)
    return {
        "gpuhost_inprocess_s": stats(g_in),
        "gpuhost_roundtrips": stats(g_rt),
        "gpuhost_cold_process_s": stats(g_cold),
        "gpuhost_cold_roundtrips": stats(g_cold_rt),
        "ansible_setup_s": stats(a_wall),
        "ansible_roundtrips": stats(a_rt),
        "ansible_top_level_facts": nfacts,
        "ansible_vvv_ssh_exec_lines": vvv,
        "ansible_wrapper_count_same_run": wrapped,
    }


def refreshed_preview(th, rtlog: RoundTripLog, flow):
    """``pulumi preview --refresh`` as the engine runs it: a fresh provider process (round trips counted from zero),
    every resource read from the host, then the preview; returns (seconds, the preview, the provider server, still
    open for what the caller does next)."""
    rtlog.reset()
    t0 = time.monotonic()
    srv = provider_server(th, rtlog)
    rebind(flow, srv)
    flow.refresh()
    pv = flow.preview()
    return time.monotonic() - t0, pv, srv


def first_apply(th, rtlog: RoundTripLog, h) -> tuple[Any, dict]:
    """One `pulumi up` = one fresh provider server; each resource timed as the engine runs it. Returns the flow
    (for the runs after it) and the apply's record."""
    from testbed.testhost.passthrough import host_flow

    rtlog.reset()
    t0 = time.monotonic()
    srv = provider_server(th, rtlog)
    flow = host_flow(srv, h)
    per, ops = {}, {}
    for s in flow.suffixes:
        ts = time.monotonic()
        ops[s] = flow.res[s].up(flow.inputs(s))[0]
        per[s] = time.monotonic() - ts
    total = time.monotonic() - t0
    record = {
        "total_s": total,
        "excluding_reboot_s": total - per["reboot"],
        "reboot_resource_s": per["reboot"],
        "per_resource_s": per,
        "ops": ops,
        "roundtrips": rtlog.count(),
        "rebooted_output": flow.res["reboot"].outputs.get("rebooted"),
        "pending_after": flow.res["reboot"].outputs.get("pending"),
        "reboots_serial": boots_seen(th) - 1,
        "resources": len(flow.suffixes),
    }
    srv.__exit__(None, None, None)
    log(f"gpuhost: apply {total:.0f} s, ops {ops}")
    return flow, record


def noop_runs(th, rtlog: RoundTripLog, flow, n: int) -> dict:
    """`pulumi up` (preview then update) on an unchanged host ``n`` times, a fresh provider process each time."""
    noop: dict[str, list] = {"wall_s": [], "roundtrips": [], "preview_changes": [], "up_ops": []}
    for _i in range(n):
        rtlog.reset()
        t0 = time.monotonic()
        srv = provider_server(th, rtlog)
        rebind(flow, srv)
        pv = flow.preview()
        ops = flow.up()
        noop["wall_s"].append(time.monotonic() - t0)
        srv.__exit__(None, None, None)
        noop["roundtrips"].append(rtlog.count())
        noop["preview_changes"].append(sum(1 for d in pv.values() if d.changes))
        noop["up_ops"].append(sorted(set(ops.values())))
    return {**noop, "wall": stats(noop["wall_s"]), "rt": stats(noop["roundtrips"]), "resources": len(flow.suffixes)}


def refresh_runs(th, rtlog: RoundTripLog, flow, n: int) -> dict:
    """`pulumi up --refresh` on the unchanged host: every resource read from the host first."""
    ref: dict[str, list] = {"wall_s": [], "roundtrips": [], "preview_changes": [], "changed": []}
    for _i in range(max(1, n - 1)):
        wall, pv, srv = refreshed_preview(th, rtlog, flow)
        ref["wall_s"].append(wall)
        srv.__exit__(None, None, None)
        ref["roundtrips"].append(rtlog.count())
        ref["changed"].append(sorted(s for s, d in pv.items() if d.changes))
        ref["preview_changes"].append(len(ref["changed"][-1]))
    return {**ref, "wall": stats(ref["wall_s"]), "rt": stats(ref["roundtrips"])}


def drift_runs(th, rtlog: RoundTripLog, flow, n: int) -> dict:
    """A hand edit of /etc/default/grub, then `pulumi preview --refresh` (all resources) ``n`` times, each followed
    by the preview of the one resource that owns the file."""
    th.ssh("sed -i 's/^GRUB_CMDLINE_LINUX=.*/GRUB_CMDLINE_LINUX=\"quiet\"/' /etc/default/grub")
    drift: dict[str, list] = {
        "wall_s": [],
        "roundtrips": [],
        "detected": [],
        "changed": [],
        "target_wall_s": [],
        "target_roundtrips": [],
    }
    for _i in range(n):
        wall, pv, srv = refreshed_preview(th, rtlog, flow)
        drift["wall_s"].append(wall)
        drift["roundtrips"].append(rtlog.count())
        drift["changed"].append(sorted(s for s, d in pv.items() if d.changes))
        drift["detected"].append(
            pv["cmdline"].changes is True and flow.res["cmdline"].outputs.get("configured") == ["quiet"]
        )
        # `pulumi preview --refresh --target <cmdline>`: the one resource that owns the file
        rtlog.reset()
        t0 = time.monotonic()
        flow.res["cmdline"].refresh()
        flow.res["cmdline"].preview(flow.inputs("cmdline"))
        drift["target_wall_s"].append(time.monotonic() - t0)
        drift["target_roundtrips"].append(rtlog.count())
        srv.__exit__(None, None, None)
    return {
        **drift,
        "wall": stats(drift["wall_s"]),
        "rt": stats(drift["roundtrips"]),
        "target_wall": stats(drift["target_wall_s"]),
        "target_rt": stats(drift["target_roundtrips"]),
    }


def gpuhost_phase(out: dict, work: Path, n: int, n_facts_ansible: int) -> dict:
    from testbed.testhost.passthrough import host_config, runtime

    th = boot(work, "gpuhost-a")
    try:
        rtlog = RoundTripLog(work / "gpuhost-roundtrips.log", th.name)
        out["pristine_runtime"] = runtime(th)
        log("facts: gpuhost read_host_facts vs ansible -m setup, interleaved on the fresh host")
        out["facts"] = facts_phase(th, work, n_gpuhost=max(n, 5), n_ansible=n_facts_ansible)
        log("gpuhost: first apply")
        flow, out["apply"] = first_apply(th, rtlog, host_config(th))
        out["runtime_after"] = runtime(th)
        out["files"] = host_files(th)
        out["noop"] = noop_runs(th, rtlog, flow, n)
        log(f"gpuhost: no-op {out['noop']['wall']}")
        out["noop_refresh"] = refresh_runs(th, rtlog, flow, n)
        changed = out["noop_refresh"]["changed"]
        log(f"gpuhost: refresh+preview on the unchanged host {out['noop_refresh']['wall']}, changed {changed}")
        out["drift"] = drift_runs(th, rtlog, flow, n)
        log(f"gpuhost: drift {out['drift']['wall']} detected {out['drift']['detected']}")
    finally:
        stop_servers()
        th.stop()
    return out


# ------------------------------------------------------------------------------------------------- ansible


REBOOT_DECISION = "Running kernel arguments and passthrough drivers"


def ansible_phase(out: dict, work: Path, n: int) -> dict:
    from bench.ansible_driver import AnsibleRun
    from testbed.testhost.passthrough import runtime

    th = boot(work, "ansible-b")
    try:
        a = AnsibleRun(work / "ansible", th)
        log("ansible: first apply")
        r = a.playbook()
        if r.rc != 0:
            raise RuntimeError(f"ansible-playbook failed (rc {r.rc}):\n{r.stdout[-4000:]}")
        reboot_part = r.time_from(REBOOT_DECISION)
        out["apply"] = {
            "total_s": r.wall_s,
            "excluding_reboot_s": r.wall_s - reboot_part,
            "reboot_part_s": reboot_part,
            "reboot_task_s": r.task_time("Reboot into the new kernel arguments and drivers"),
            "roundtrips": r.roundtrips,
            "changed": r.changed,
            "ok": r.ok,
            "changed_tasks": r.changed_tasks(),
            "reboots_serial": boots_seen(th) - 1,
            "tasks": [{k: t[k] for k in ("name", "start", "end", "status", "changed")} for t in r.tasks],
        }
        log(f"ansible: apply {r.wall_s:.0f} s, changed={r.changed}")
        out["runtime_after"] = runtime(th)
        out["files"] = host_files(th)

        noop: dict[str, list] = {"wall_s": [], "roundtrips": [], "changed": [], "changed_tasks": []}
        for _i in range(n):
            r = a.playbook()
            noop["wall_s"].append(r.wall_s)
            noop["roundtrips"].append(r.roundtrips)
            noop["changed"].append(r.changed)
            noop["changed_tasks"].append(r.changed_tasks())
        out["noop"] = {
            **noop,
            "wall": stats(noop["wall_s"]),
            "rt": stats(noop["roundtrips"]),
            "tasks": sum(1 for t in r.tasks),
        }
        log(f"ansible: no-op {out['noop']['wall']} changed {noop['changed']}")

        th.ssh("sed -i 's/^GRUB_CMDLINE_LINUX=.*/GRUB_CMDLINE_LINUX=\"quiet\"/' /etc/default/grub")
        drift: dict[str, list] = {"wall_s": [], "roundtrips": [], "changed": [], "detected": []}
        for _i in range(n):
            r = a.playbook("--check", "--diff")
            drift["wall_s"].append(r.wall_s)
            drift["roundtrips"].append(r.roundtrips)
            drift["changed"].append(r.changed_tasks())
            drift["detected"].append(
                "Kernel arguments in GRUB_CMDLINE_LINUX" in r.changed_tasks()
                and '-GRUB_CMDLINE_LINUX="quiet"' in r.stdout
            )
        out["drift"] = {**drift, "wall": stats(drift["wall_s"]), "rt": stats(drift["roundtrips"])}
        log(f"ansible: drift {out['drift']['wall']} detected {drift['detected']}")
    finally:
        th.stop()
    return out


def compare_files(g: dict, a: dict) -> dict:
    def meaningful(text: str | None):
        if text is None:
            return None
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]

    out = {}
    for path in g:
        if g[path] == a.get(path):
            out[path] = "identical"
        elif meaningful(g[path]) == meaningful(a.get(path)):
            out[path] = "same settings (comments differ)"
        else:
            out[path] = "DIFFERENT"
    return out


# ------------------------------------------------------------------------------------------------- pure


def pure_phase(out: dict, n: int) -> dict:
    import random

    import components.triton_service as ts
    from bench.bench_placement import make
    from bench.fleet import fleet_config
    from plans.placement import place
    from testbed.mocks import run_program

    rng = random.Random(5)
    cases = [make(i, rng) for i in range(1000)]
    samples, placed = [], 0
    for _ in range(max(n, 5)):
        t0 = time.perf_counter()
        placed = sum(len(place(h, r).vms) for h, r in cases)
        samples.append(time.perf_counter() - t0)
    out["placement"] = {"hosts": 1000, "vms_placed": placed, "wall": stats(samples)}

    cfg, secret = fleet_config(100)
    body_time = [0.0]
    real = getattr(ts, "infer_body", None)

    def timed(*a, **kw):  # how much of the program's time is building acceptance-gate request bodies
        t = time.perf_counter()
        assert real is not None  # patched in only where it exists
        try:
            return real(*a, **kw)
        finally:
            body_time[0] += time.perf_counter() - t

    patched = hasattr(ts, "infer_body")  # older TritonService built gate request bodies at program time
    walls, cpus, loads, bodies = [], [], [], []
    # the SDK's own floor, interleaved with the program's runs so that each round sees the same load
    floors = _mocks_floors(cfg, secret) if _has_floor() else {}
    floor_cpus: dict[str, list[float]] = {k: [] for k in floors}
    with mock.patch.object(ts, "infer_body", timed) if patched else contextlib.nullcontext():
        for _ in range(n):
            body_time[0] = 0.0
            loads.append(Path("/proc/loadavg").read_text().split()[0])  # the machine is shared: how busy it was
            t0, c0 = time.perf_counter(), time.process_time()
            rec = run_program(cfg, secret, stack="bench-100")
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            bodies.append(body_time[0])
            for k, body in floors.items():
                c0 = time.process_time()
                run_program(cfg, secret, stack="bench-100", body=body)
                floor_cpus[k].append(time.process_time() - c0)
    types = rec.types()
    gate_inputs = [len(json.dumps(r.inputs)) for r in rec.registrations if r.type.endswith(":AcceptanceGate")]
    out["mocks"] = {
        "hosts": types.get("gpuhost:host:PassthroughHost", 0),
        "resources": len(rec.registrations),
        "duplicate_urns": len(rec.duplicate_urns()),
        "wall": stats(walls),
        "cpu": stats(cpus),
        "loadavg_1min": loads,
        "infer_body_s": stats(bodies) if patched else {},
        "acceptance_gates": len(gate_inputs),
        "largest_gate_inputs_bytes": max(gate_inputs) if gate_inputs else 0,
        "floor_cpu": {k: stats(v) for k, v in floor_cpus.items()},
    }
    return out


def _has_floor() -> bool:
    return (ROOT / "bench" / "mocks_floor.py").exists()  # an older commit measured has none


def _mocks_floors(cfg: dict, secret: list) -> dict:
    """The SDK's mock runtime alone (bench/mocks_floor.py): the same number of plain resources, and the program's
    own registrations declared again from plain values."""
    from bench.mocks_floor import record_with_outputs, replay_body, trivial_body

    rec, outputs = record_with_outputs(cfg, secret, stack="bench-100")
    components = sum(1 for r in rec.registrations if not r.custom)
    return {
        "trivial": trivial_body(len(rec.registrations), components),
        "replay": replay_body(rec, outputs),
    }


# ------------------------------------------------------------------------------------------------- report


def fmt(st: dict, unit: str = "s", digits: int = 1) -> str:
    if not st:
        return "–"
    m, lo, hi = (f"{st[k]:.{digits}f}" for k in ("median", "min", "max"))
    if st["n"] == 1:
        return f"{m} {unit} (N=1)"
    return f"{m} {unit} ({lo}–{hi}, N={st['n']})"


def fmt_int(st: dict) -> str:
    if not st:
        return "–"
    if st["min"] == st["max"]:
        return f"{st['median']:.0f}"
    return f"{st['median']:.0f} ({st['min']:.0f}–{st['max']:.0f})"


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "–"
    return f"{b / a:.1f}×"


def table(r: dict) -> str:
    m = r["machine"]
    g, a, p = r.get("gpuhost", {}), r.get("ansible", {}), r.get("pure", {})
    rows = ["| Measure | gpuhost | Ansible baseline | Ansible ÷ gpuhost | Target |", "|---|---|---|---|---|"]
    if g.get("facts"):
        f = g["facts"]
        rows.append(
            f"| 1. Read all host facts: SSH round trips | {fmt_int(f['gpuhost_roundtrips'])} | "
            f"{fmt_int(f['ansible_roundtrips'])} | – | 1 |"
        )
        rows.append(
            f"| 1. Read all host facts: wall, fresh process incl. connect | "
            f"{fmt(f['gpuhost_cold_process_s'])} | {fmt(f['ansible_setup_s'])} | "
            f"{ratio(f['gpuhost_cold_process_s']['median'], f['ansible_setup_s'].get('median'))} | – |"
        )
        rows.append(
            f"| 1. Read all host facts: wall, in process incl. connect | {fmt(f['gpuhost_inprocess_s'])} | – | – | – |"
        )
    try:
        _pair_rows(rows, g, a)
    except KeyError as e:
        rows.append(f"| (incomplete: {e} missing; see results.json) | | | | |")
    _pure_rows(rows, p)
    head = (
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_gib']} GiB, emulated host under "
        f"{m['accel'].upper()}, load average at start {' '.join(m['loadavg_start'])}, at end "
        f"{' '.join(m.get('loadavg_end', ['?']))} (shared with other work); {m['ansible']}; {m['date']}."
        + "".join(
            f" {ph} phase measured at commit {r[ph]['commit']}."
            for ph in ("gpuhost", "ansible", "pure")
            if r.get(ph, {}).get("commit")
        )
    )
    return head + "\n\n" + "\n".join(rows) + "\n"


def _pair_rows(rows: list, g: dict, a: dict) -> None:
    if g and a:
        ga, aa = g["apply"], a["apply"]
        rows.append(
            f"| 2. First apply of host prep, excluding the reboot | {ga['excluding_reboot_s']:.0f} s (N=1) | "
            f"{aa['excluding_reboot_s']:.0f} s (N=1) | "
            f"{ratio(ga['excluding_reboot_s'], aa['excluding_reboot_s'])} | ≥ 3× |"
        )
        rows.append(
            f"| 2. First apply, total incl. reboot | {ga['total_s']:.0f} s | {aa['total_s']:.0f} s | "
            f"{ratio(ga['total_s'], aa['total_s'])} | – |"
        )
        rows.append(f"| 2. First apply: SSH round trips | {ga['roundtrips']} | {aa['roundtrips']} | – | – |")
        rows.append(
            f"| 2. Reboots (tool's report / serial console kernel starts − 1) | "
            f"{1 if ga['rebooted_output'] else 0} / {ga['reboots_serial']} | "
            f"{1 if 'Reboot into the new kernel arguments and drivers' in aa['changed_tasks'] else 0} / "
            f"{aa['reboots_serial']} | – | exactly 1 |"
        )
        gn, an = g["noop"], a["noop"]
        rows.append(
            f"| 3. No-op run: wall | {fmt(gn['wall'])} | {fmt(an['wall'])} | "
            f"{ratio(gn['wall']['median'], an['wall']['median'])} | – |"
        )
        rows.append(
            f"| 3. No-op run: SSH round trips ({gn['resources']} resources / {an['tasks']} tasks) | "
            f"{fmt_int(gn['rt'])} | {fmt_int(an['rt'])} | – | ≤ 1 per resource |"
        )
        rows.append(
            f"| 3. No-op run: changes reported | {max(gn['preview_changes'])} "
            f"(`up` ops: {', '.join(sorted({o for ops in gn['up_ops'] for o in ops}))}) | "
            f"changed={','.join(str(c) for c in an['changed'])} | – | 0 |"
        )
        gr = g["noop_refresh"]
        rows.append(
            f"| 3b. Unchanged host, `pulumi preview --refresh` (reads every resource) | "
            f"{fmt(gr['wall'])}, {fmt_int(gr['rt'])} round trips, "
            f"{max(gr['preview_changes'])} changes | (Ansible always reads) | – | – |"
        )
        gd, ad = g["drift"], a["drift"]
        rows.append(
            f"| 4. Drift after a hand edit of /etc/default/grub: wall (whole host) | {fmt(gd['wall'])} | "
            f"{fmt(ad['wall'])} | {ratio(gd['wall']['median'], ad['wall']['median'])} | – |"
        )
        rows.append(f"| 4. Drift: SSH round trips | {fmt_int(gd['rt'])} | {fmt_int(ad['rt'])} | – | – |")
        rows.append(
            f"| 4. Drift: detected | {'yes' if all(gd['detected']) else 'NO'} "
            f"(changed: {', '.join(gd['changed'][0])}) | "
            f"{'yes' if all(ad['detected']) else 'NO'} (changed: {', '.join(ad['changed'][0])}) | – | – |"
        )
        rows.append(
            f"| 4. Drift, only the KernelCmdline resource (`--target`) | {fmt(gd['target_wall'])}, "
            f"{fmt_int(gd['target_rt'])} round trip(s) | – | – | – |"
        )


def _pure_rows(rows: list, p: dict) -> None:
    if p.get("mocks"):
        pl, mk = p["placement"], p["mocks"]
        rows.append(
            f"| 5. Placement solver, {pl['hosts']} hosts × 8 VMs | {fmt(pl['wall'], digits=3)} | – | – | < 1 s |"
        )
        rows.append(
            f"| 5. Whole program under Pulumi mocks, {mk['hosts']} hosts ({mk['resources']} resources) | "
            f"{fmt(mk['wall'])}"
            + (
                f", CPU {fmt(mk['cpu'])}; per resource {1000 * mk['wall']['median'] / mk['resources']:.2f} ms "
                f"(CPU {1000 * mk['cpu']['median'] / mk['resources']:.2f} ms); 1-min load at each run "
                f"{', '.join(mk['loadavg_1min'])}"
                if mk.get("cpu")
                else ""
            )
            + (
                f"; of which building acceptance-gate request bodies {fmt(mk['infer_body_s'])}"
                if mk.get("infer_body_s")
                else ""
            )
            + (
                f"; SDK mock runtime alone, same rounds: {mk['resources']} plain resources CPU "
                f"{fmt(mk['floor_cpu']['trivial'])}, the program's own registrations from plain values CPU "
                f"{fmt(mk['floor_cpu']['replay'])}"
                if mk.get("floor_cpu")
                else ""
            )
            + " | – | – | < 5 s |"
        )


def write(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    md = table(results)
    if "compare" in results:
        md += (
            "\nFiles both tools wrote, compared after each first apply:\n\n"
            + "\n".join(f"- `{k}`: {v}" for k, v in results["compare"].items())
            + "\n"
        )
        if results.get("runtime_compare"):
            md += f"\nRunning state after the first apply: {results['runtime_compare']}\n"
    (RESULTS / "results.md").write_text(md)
    if DOC.exists():
        text = DOC.read_text()
        if BEGIN in text and END in text:
            pre, rest = text.split(BEGIN, 1)
            _, post = rest.split(END, 1)
            DOC.write_text(pre + BEGIN + "\n" + md + END + post)
            return
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text("# Benchmarks\n\n" + BEGIN + "\n" + md + END + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="gpuhost,ansible,pure", help="phases, comma-separated")
    ap.add_argument("--n", type=int, default=3, help="runs of each cheap gpuhost measurement (facts: at least 5)")
    ap.add_argument(
        "--n-ansible",
        type=int,
        default=2,
        help="runs of each Ansible no-op and drift measurement (each costs ~2 min under TCG)",
    )
    ap.add_argument("--n-facts-ansible", type=int, default=3, help="runs of `ansible -m setup`")
    ap.add_argument("--keep", action="store_true", help="merge into the existing results.json (re-run one phase)")
    a = ap.parse_args(argv)
    phases = a.only.split(",")
    results = {}
    if a.keep and (RESULTS / "results.json").exists():
        results = json.loads((RESULTS / "results.json").read_text())
    here = machine()
    if not (a.keep and "machine" in results):  # with --keep the table's machine line stays the full run's
        results["machine"] = here
    work = Path(tempfile.mkdtemp(prefix="gpuhost-bench-"))
    log(f"work dir {work}")
    t0 = time.monotonic()
    runs = {
        "gpuhost": lambda out: gpuhost_phase(out, work, a.n, a.n_facts_ansible),
        "ansible": lambda out: ansible_phase(out, work, a.n_ansible),
        "pure": lambda out: pure_phase(out, a.n),
    }
    for phase in ("gpuhost", "ansible", "pure"):
        if phase not in phases:
            continue
        results[phase] = {
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
        }
        results[phase]["machine"] = {**here, "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}
        try:
            runs[phase](results[phase])
        except Exception as e:  # keep what was measured; the error goes into results.json
            import traceback

            results[phase]["error"] = traceback.format_exc()
            log(f"{phase} phase failed: {e}")
        results["errors"] = {p: r["error"] for p, r in results.items() if isinstance(r, dict) and "error" in r}
        try:
            write(results)
        except Exception as e:
            log(f"writing the table failed: {e}")
    if "files" in results.get("gpuhost", {}) and "files" in results.get("ansible", {}):
        results["compare"] = compare_files(results["gpuhost"]["files"], results["ansible"]["files"])
        gr, ar = dict(results["gpuhost"]["runtime_after"]), dict(results["ansible"]["runtime_after"])
        gr.pop("boot_id", None), ar.pop("boot_id", None)
        results["runtime_compare"] = "identical" if gr == ar else f"gpuhost {gr} vs ansible {ar}"
    if not (a.keep and "loadavg_end" in results["machine"]):
        results["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    results[f"bench_wall_s_{'_'.join(phases)}"] = time.monotonic() - t0
    write(results)
    print((RESULTS / "results.md").read_text())


if __name__ == "__main__":
    main()
