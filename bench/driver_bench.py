"""Host prep through the deployment driver (tools/driver: the engine's parallel steps) vs the Ansible playbook.

    .venv/bin/python -m bench.driver_bench                  # both phases (~15 min on 2 TCG cores)
    .venv/bin/python -m bench.driver_bench --only gpuhost   # or --only ansible; --keep merges into the last results

Each phase boots a fresh copy-on-write overlay of the cached base image (testbed/testhost). gpuhost: a one-host stack
(the same PassthroughHost values as bench/run.py, testbed/testhost/passthrough.py::host_config) run by
`tools.driver.Driver.up()`, as `pulumi up` would: the program registers every resource, each step runs as soon as
its dependencies are done. Every step's start and duration come from the driver's own step records
(`Outcome.steps`); "excluding the reboot" is the time from the start of the `up` to the start of the HostReboot step
(the reboot decision), as bench/run.py takes Ansible's time from its reboot-decision task. A no-op `up` follows.
Ansible: bench/run.py's ansible phase (first apply of bench/ansible/host_prep.yml only); with `--only gpuhost` and
no Ansible phase in the results, Ansible's first apply is taken from bench/run.py's bench/results/results.json (the
table says so).

Where the time goes: every mutating script runs under the host lock (facts/state.py `locked`), which logs
"<epoch> waiting|acquired|released <holder>" in /run/gpuhost.lock.log on the host. A thread streams that log over its
own SSH connection (one `tail -F` exec under another host name, so not among the counted round trips) until the
reboot cuts it; each step's time is then split into waiting for the lock, holding it (the host's own commands:
update-grub, update-initramfs, driverctl, tuned-adm, ...) and the rest (gpuhost's own: the provider call, connect,
reads, checks), and the step that ended last before the HostReboot step started is the critical path.

Writes bench/results/driver.json and the table between the BEGIN/END driver markers of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.run import DOC, RESULTS, ROOT, RoundTripLog, boot, boots_seen, host_files, log, machine

BEGIN, END = "<!-- BEGIN bench/driver_bench.py table -->", "<!-- END bench/driver_bench.py table -->"
PASSPHRASE = "bench"


def one_host_stack(th) -> tuple:
    """StackConfig for a fleet of one host: PassthroughHost with bench/run.py's values, the run's key as secret."""
    from testbed.testhost.passthrough import host_config
    from tools.driver import StackConfig

    host = host_config(th).model_dump(mode="json", exclude_none=True)
    cfg = StackConfig({}, []).with_values(fleet={"hosts": [host]}, sshPrivateKey=th.private_key_pem)
    cfg.secret_keys.append("gpuhost:sshPrivateKey")
    return cfg, host["name"]


class LockWatch:
    """Streams the host's lock log (facts/state.py LOCK + ".log") into this process until the reboot cuts it.

    Its own SSH connection under another host name (`<host>-lockwatch`): the driver's provider process counts its
    round trips for the host's name only, and this one is a single exec (`tail -F`) for the whole `up` (plus the
    clock samples, taken before the `up` starts). /run is a tmpfs, so the log is gone after the reboot: what was
    streamed before it is all there is."""

    def __init__(self, th):
        from access import ssh
        from pristine import LOCK

        self.log_path = LOCK + ".log"
        self.spec = th.host_spec(name=f"{th.name}-lockwatch")
        self.conn = ssh._open(self.spec)  # not the pooled connection: its own transport
        self.lines: list[tuple[float, str]] = []  # (local wall time at arrival, line)
        self.clock: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_clock(self, n: int = 5) -> float:
        """host epoch - local epoch, from the `date` round trip with the smallest RTT (at its midpoint)."""
        for _ in range(n):
            a = time.time()
            host = float(self.conn.run("date +%s.%N").stdout)
            b = time.time()
            self.clock.append({"rtt_s": round(b - a, 4), "offset_s": round(host - (a + b) / 2, 4)})
        return min(self.clock, key=lambda c: c["rtt_s"])["offset_s"]

    def start(self) -> None:
        from access.shell import sh

        chan = self.conn.client.get_transport().open_session()  # type: ignore[union-attr]
        chan.settimeout(1.0)
        cmd = sh("stdbuf", "-oL", "tail", "-n", "+1", "-F", self.log_path)
        chan.exec_command(cmd if self.spec.user == "root" else sh("sudo", "-n", "sh", "-c", cmd))

        def pump() -> None:
            buf = b""
            while not self._stop.is_set():
                try:
                    data = chan.recv(65536)
                except socket.timeout:
                    continue
                except Exception:
                    break
                if not data:
                    break
                now = time.time()
                buf += data
                *done, buf = buf.split(b"\n")
                self.lines += [(now, ln.decode(errors="replace")) for ln in done if ln.strip()]

        self._thread = threading.Thread(target=pump, name="lockwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        try:
            self.conn.close()
        except Exception:
            pass


def parse_lock_log(lines: list[str]) -> list[tuple[float, str, str]]:
    """`<epoch> waiting|acquired|released <holder> [<classes>]` lines as (epoch, event, holder); anything else (a
    line cut by the reboot) is skipped. The classes are in `lock_classes`."""
    return [(ts, ev, who) for ts, ev, who, _ in parse_lock_events(lines)]


def parse_lock_events(lines: list[str]) -> list[tuple[float, str, str, str]]:
    """(epoch, event, holder, classes): classes "host" for the host lock alone (taken exclusively), else the
    resource classes joined by "+" (facts/state.py `locked`)."""
    out = []
    for ln in lines:
        parts = ln.split()
        if len(parts) in (3, 4) and parts[1] in ("waiting", "acquired", "released"):
            try:
                out.append((float(parts[0]), parts[1], parts[2], parts[3] if len(parts) == 4 else "host"))
            except ValueError:
                continue
    return out


def lock_classes(lines: list[str]) -> dict[str, str]:
    """holder -> the classes its last hold named."""
    return {who: cls for _, _, who, cls in parse_lock_events(lines)}


def conflicts(a: str, b: str) -> bool:
    """Two holds exclude each other: either took the host lock alone, or they share a class."""
    return a == "host" or b == "host" or bool(set(a.split("+")) & set(b.split("+")))


def union_s(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start, end) spans."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def lock_holds(events: list[tuple[float, str, str]]) -> list[dict]:
    """One record per hold: holder, waiting (None when the lock was free), acquired, released (None: cut off)."""
    holds: list[dict] = []
    waiting: dict[str, float] = {}
    open_: dict[str, dict] = {}
    for ts, ev, who in sorted(events):
        if ev == "waiting":
            waiting[who] = ts
        elif ev == "acquired":
            h = {"holder": who, "waiting": waiting.pop(who, None), "acquired": ts, "released": None}
            holds.append(h)
            open_[who] = h
        elif who in open_:
            open_.pop(who)["released"] = ts
    return holds


def lock_account(
    steps: list[dict], holds: list[dict], host_t0: float, reboot_start_s: float, classes: dict | None = None
) -> dict:
    """Each step's seconds split into waiting for the host's locks, holding them and the rest; the critical path.

    `steps`: step_records(); `holds`: lock_holds() in host epoch seconds; `host_t0`: the host's clock at the start
    of the `up` (local start + measured offset); `classes`: lock_classes() (holder -> "boot", "sysctl", ...; "host"
    when absent: the host lock alone). A hold belongs to the step its holder names ("<stack>/<name>"); a step waited
    behind the holds that conflict with its own (the host lock alone, or a shared class)."""
    classes = classes or {}
    rel: list[dict[str, Any]] = [
        {
            **{k: (round(v - host_t0, 2) if isinstance(v, float) else v) for k, v in h.items()},
            "classes": classes.get(h["holder"], "host"),
        }
        for h in holds
    ]
    per: dict[str, dict] = {}
    for s in steps:
        mine = [h for h in rel if h["holder"].split("/", 1)[-1] == s["name"]]
        wait = sum(h["acquired"] - h["waiting"] for h in mine if h["waiting"] is not None)
        hold = sum((h["released"] if h["released"] is not None else h["acquired"]) - h["acquired"] for h in mine)
        behind = sorted(
            {
                o["holder"].split("/", 1)[-1]
                for h in mine
                if h["waiting"] is not None
                for o in rel
                if o is not h
                and o["acquired"] < h["acquired"]
                and (o["released"] or 1e18) > h["waiting"]
                and conflicts(o["classes"], h["classes"])
            }
        )
        per[s["name"]] = {
            "wait_s": round(wait, 2),
            "hold_s": round(hold, 2),
            "rest_s": round(s["seconds"] - wait - hold, 2),
            "holds": mine,
            "waited_behind": behind,
            "cut_off": any(h["released"] is None for h in mine),
            "classes": "+".join(sorted({h["classes"] for h in mine})),
        }
    before = [s for s in steps if s["type"] != "HostReboot" and s["start_s"] < reboot_start_s]
    last = max(before, key=lambda s: s["start_s"] + s["seconds"]) if before else None
    done = [h for h in rel if h["released"] is not None and h["acquired"] < reboot_start_s]
    # The time at least one lock was held before the reboot decision (holds of different classes overlap).
    busy = union_s([(h["acquired"], min(h["released"], reboot_start_s)) for h in done])
    by_class: dict[str, float] = {}
    for h in done:
        for c in h["classes"].split("+"):
            by_class[c] = round(by_class.get(c, 0.0) + min(h["released"], reboot_start_s) - h["acquired"], 2)
    first = min((h["acquired"] for h in done), default=0.0)
    named = {s["name"] for s in steps}
    return {
        "steps": per,
        "holds": rel,
        "unmatched_holders": sorted({h["holder"] for h in rel if h["holder"].split("/", 1)[-1] not in named}),
        "critical": (
            {
                "step": last["name"],
                "ends_s": round(last["start_s"] + last["seconds"], 2),
                "reboot_starts_s": reboot_start_s,
                **{k: per[last["name"]][k] for k in ("wait_s", "hold_s", "rest_s", "waited_behind")},
            }
            if last
            else None
        ),
        "lock_busy_s": round(busy, 2),
        "held_by_class_s": by_class,
        "lock_first_acquired_s": round(first, 2),
        "lock_busy_share": round(busy / max(1e-9, reboot_start_s - first), 3) if done else None,
        "holds_sum_s": round(sum(p["hold_s"] for p in per.values()), 2),
    }


def step_records(outcome, t_start: float) -> list[dict]:
    """Every custom resource's step: offset from the start of the `up`, duration, operation."""
    out = []
    for s in outcome.steps:
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


def apply_record(up: Any, wall: float, steps: list[dict], reboot: dict, rtlog: RoundTripLog, th: Any) -> dict:
    """The first `up`: its wall time up to and past the reboot decision, its steps, round trips and reboots."""
    prep = [s for s in steps if s["type"] != "HostReboot" and s["start_s"] < reboot["start_s"]]
    return {
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


def lock_record(watch: LockWatch, offset: float, steps: list[dict], t0_wall: float, reboot: dict) -> dict:
    """The host lock's log over the first `up` and each step's time waiting for it, holding it and the rest."""
    lines = [ln for _, ln in watch.lines]
    holds = lock_holds(parse_lock_log(lines))
    return {
        "log_lines": lines,
        "clock_samples": watch.clock,
        "host_minus_local_s": offset,
        # arrival (local, moved to the host's clock) minus the line's own time: the stream's delay
        "stream_delay_s": [round(at + offset - ev[0], 3) for at, ln in watch.lines for ev in parse_lock_log([ln])],
        **lock_account(steps, holds, t0_wall + offset, reboot["start_s"], lock_classes(lines)),
    }


def noop_record(d: Any, rtlog: RoundTripLog) -> dict:
    """A second `up` right after the first: its wall time, changes and round trips."""
    rtlog.reset()
    t0 = time.monotonic()
    noop = d.up()
    rec = {
        "wall_s": time.monotonic() - t0,
        "changes": noop.changes(),
        "counts": noop.counts(),
        "roundtrips": rtlog.count(),
        "errors": noop.errors,
    }
    log(f"gpuhost (driver): no-op up {rec['wall_s']:.0f} s, {noop.changes()} changes")
    return rec


def gpuhost_phase(out: dict, work: Path) -> dict:
    import os

    from testbed.testhost.passthrough import runtime
    from tools.driver import Driver

    th = boot(work, "driver-a")
    watch: LockWatch | None = None
    try:
        cfg, name = one_host_stack(th)
        rtlog = RoundTripLog(work / "driver-roundtrips.log", name)
        rtlog.reset()
        os.environ["GPUHOST_ROUNDTRIP_LOG"] = str(rtlog.path)  # the driver's provider process inherits it
        state = work / "driver-state.json"
        watch = LockWatch(th)
        offset = watch.sample_clock()
        watch.start()
        with open(work / "driver-up.log", "w") as plan_out:
            d = Driver(ROOT, "bench", passphrase=PASSPHRASE, config=cfg, state=state, out=plan_out)
            log(f"gpuhost (driver): first up (host clock - local: {offset:+.3f} s)")
            out["loadavg_before_up"] = Path("/proc/loadavg").read_text().split()[:3]
            t0_wall, t0 = time.time(), time.monotonic()
            up = d.up()
            wall = time.monotonic() - t0
            out["loadavg_after_up"] = Path("/proc/loadavg").read_text().split()[:3]
            watch.stop()  # the stream ended with the reboot; this closes its connection
            if up.errors:
                raise RuntimeError(f"up failed: {up.errors}")
            steps = step_records(up, t0)
            reboot = next(s for s in steps if s["type"] == "HostReboot")
            out["apply"] = apply_record(up, wall, steps, reboot, rtlog, th)
            out["lock"] = lock_record(watch, offset, steps, t0_wall, reboot)
            log(f"gpuhost (driver): up {wall:.0f} s, reboot decision at {reboot['start_s']:.0f} s")
            out["runtime_after"] = runtime(th)
            out["files"] = host_files(th)
            out["noop"] = noop_record(d, rtlog)
        os.environ.pop("GPUHOST_ROUNDTRIP_LOG", None)
        out["reboots_serial_end"] = boots_seen(th) - 1
    finally:
        if watch is not None:
            watch.stop()
        out["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        th.stop()
    return out


def ansible_phase(out: dict, work: Path) -> dict:
    from bench import run

    out["loadavg_before_up"] = Path("/proc/loadavg").read_text().split()[:3]
    run.ansible_phase(out, work, 0)  # first apply only (no-op and drift: bench/run.py)
    out["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    return out


def compare(results: dict) -> None:
    """Files and runtime state after both first applies (bench/run.py's comparison)."""
    from bench.run import compare_files

    g, a = results.get("gpuhost", {}), results.get("ansible", {})
    if "files" in g and "files" in a:
        results["compare"] = compare_files(g["files"], a["files"])
        gr, ar = dict(g["runtime_after"]), dict(a["runtime_after"])
        gr.pop("boot_id", None), ar.pop("boot_id", None)
        results["runtime_compare"] = "identical" if gr == ar else f"gpuhost {gr} vs ansible {ar}"


def ansible_from_run_results(path: Path = RESULTS / "results.json") -> dict | None:
    """Ansible's first apply as bench/run.py recorded it (used when this bench's own Ansible phase did not run)."""
    if not path.exists():
        return None
    r = json.loads(path.read_text())
    a = r.get("ansible") or {}
    if not a.get("apply"):
        return None
    m = r.get("machine", {})
    return {
        "from": f"bench/results/results.json (bench/run.py, {m.get('date', '?')})",
        "commit": a.get("commit", "?"),
        "machine": {"loadavg_start": m.get("loadavg_start", ["?"]), "date": m.get("date", "?")},
        "apply": {k: a["apply"][k] for k in ("total_s", "excluding_reboot_s", "roundtrips", "reboots_serial", "tasks")},
    }


def _header(r: dict) -> list[str]:
    """The machine and load line, then the head of the first-apply table."""
    m = r["machine"]
    g, a = r.get("gpuhost", {}), r.get("ansible", {})
    return [
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), emulated host under {m['accel'].upper()}, load average (1, 5, "
        f"15 min) at the start of each phase: gpuhost {' '.join(g.get('machine', {}).get('loadavg_start', ['?']))}, "
        f"ansible {' '.join(a.get('machine', {}).get('loadavg_start', ['?']))} (shared with other work); {m['date']}; "
        f"gpuhost at commit {g.get('commit', '?')}, ansible at commit {a.get('commit', '?')}"
        + (f"; phases in this order: {', '.join(r['order'])}" if r.get("order") else "")
        + "."
        + (f" Ansible not re-run: its first apply is taken from {a['from']}." if a.get("from") else "")
        + (
            f" Load average (1, 5, 15 min) before the gpuhost `up` {' '.join(g['loadavg_before_up'])}, after it "
            f"{' '.join(g['loadavg_after_up'])}."
            if g.get("loadavg_after_up")
            else ""
        )
        + (
            f" Before Ansible's playbook {' '.join(a['loadavg_before_up'])}, after it {' '.join(a['loadavg_end'])}."
            if a.get("loadavg_end")
            else ""
        ),
        "",
        "| First apply of host prep, fresh overlay | gpuhost via tools/driver | Ansible host_prep.yml | "
        "Ansible ÷ gpuhost | Target |",
        "|---|---|---|---|---|",
    ]


def _apply_rows(r: dict, ga: dict, aa: dict) -> list[str]:
    """Both first applies side by side, and whether they left the same files and runtime state."""
    ratio = aa["excluding_reboot_s"] / ga["excluding_reboot_s"]
    lines = [
        f"| Excluding the reboot (to the reboot decision) | {ga['excluding_reboot_s']:.0f} s | "
        f"{aa['excluding_reboot_s']:.0f} s | {ratio:.2f}× | ≥ 3.5× |",
        f"| Total incl. reboot | {ga['total_s']:.0f} s | {aa['total_s']:.0f} s | "
        f"{aa['total_s'] / ga['total_s']:.1f}× | – |",
        f"| SSH round trips | {ga['roundtrips']} | {aa['roundtrips']} | – | – |",
        f"| Reboots (serial console kernel starts − 1) | {ga['reboots_serial']} | {aa['reboots_serial']} | – | 1 |",
    ]
    if r.get("compare"):
        same = [k for k, v in r["compare"].items() if v == "identical"]
        other = "; ".join(f"`{k}`: {v}" for k, v in r["compare"].items() if v != "identical")
        lines.append(
            f"| Files both wrote, runtime state after (bench/run.py's comparison) | {len(same)} of "
            f"{len(r['compare'])} byte-identical{' (' + other + ')' if other else ''}; runtime state "
            f"{r.get('runtime_compare', '?')} | – | – | identical |"
        )
    return lines


def _step_rows(ga: dict, lk: dict) -> list[str]:
    """gpuhost's steps as the driver ran them, each split into waiting for the host lock, holding it and the rest."""
    acc = lk.get("steps", {})
    lines = [
        "",
        "gpuhost's steps as the driver ran them (seconds from the start of the `up`), each split by the host "
        "lock's log into waiting for the locks, holding them (the host's own commands; in brackets the lock: "
        "`host` alone excludes every other change, a class — boot, hugepages, sysctl, vfio — only changes of "
        "that class) and the rest (gpuhost's own: provider call, connect, reads, checks):",
        "",
        "| Step | Resource | Starts at | Ends at | Takes | Waiting for the lock | Holding it | Rest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in ga["steps"]:
        a_ = acc.get(s["name"])
        split = (
            f"{a_['wait_s']:.1f} s"
            + (f" (behind {', '.join(a_['waited_behind'])})" if a_["waited_behind"] else "")
            + f" | {a_['hold_s']:.1f} s{' (' + a_['classes'] + ')' if a_.get('classes') else ''}"
            + f"{' (cut off by the reboot)' if a_['cut_off'] else ''} | {a_['rest_s']:.1f} s"
            if a_
            else "– | – | –"
        )
        lines.append(
            f"| {s['name']} | {s['type']} ({s['op']}) | {s['start_s']:.1f} s | "
            f"{s['start_s'] + s['seconds']:.1f} s | {s['seconds']:.1f} s | {split} |"
        )
    return lines


def _critical_path(lk: dict) -> list[str]:
    """The step that ended last before the reboot decision, and how busy the host lock was until then."""
    c = lk["critical"]
    return [
        "",
        f"Critical path: {c['step']} ended last ({c['ends_s']:.1f} s; waited {c['wait_s']:.1f} s for the "
        f"lock{' behind ' + ', '.join(c['waited_behind']) if c['waited_behind'] else ''}, held it "
        f"{c['hold_s']:.1f} s, rest {c['rest_s']:.1f} s); the HostReboot step started at "
        f"{c['reboot_starts_s']:.1f} s. The lock was held {lk['lock_busy_s']:.1f} s of the "
        f"{c['reboot_starts_s'] - lk['lock_first_acquired_s']:.1f} s from its first acquisition "
        f"({lk['lock_first_acquired_s']:.1f} s) to the reboot decision ({100 * (lk['lock_busy_share'] or 0):.0f} %)"
        + (
            "; held per class (holds of different classes overlap): "
            + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(lk["held_by_class_s"].items()))
            if lk.get("held_by_class_s")
            else ""
        )
        + "; "
        f"host clock − local {lk['host_minus_local_s']:+.3f} s (smallest-RTT `date` of "
        f"{len(lk['clock_samples'])}).",
    ]


def table(r: dict) -> str:
    g, a = r.get("gpuhost", {}), r.get("ansible", {})
    lines = _header(r)
    ga, aa = g.get("apply"), a.get("apply")
    if ga and aa:
        lines += _apply_rows(r, ga, aa)
    if g.get("noop"):
        lines.append(
            f"| No-op `up` right after (preview + up, {g['noop']['changes']} changes) | {g['noop']['wall_s']:.0f} s, "
            f"{g['noop']['roundtrips']} round trips | – | – | 0 changes |"
        )
    if ga:
        lk = g.get("lock") or {}
        lines += _step_rows(ga, lk)
        if lk.get("critical"):
            lines += _critical_path(lk)
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
    ap.add_argument(
        "--order",
        default="gpuhost,ansible",
        help="the order the phases run in (alternate it between runs: the machine's load drifts)",
    )
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
    order = [p for p in a.order.split(",") if p in runs]
    results["order"] = [p for p in order if p in a.only.split(",")]
    for phase in order + [p for p in runs if p not in order]:
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
    compare(results)
    write(results)
    if "apply" not in results.get("ansible", {}):
        prior = ansible_from_run_results()
        if prior:
            results["ansible"] = prior
            write(results)
    print((RESULTS / "driver.md").read_text())
    sys.exit(1 if any("error" in results.get(p, {}) for p in ("gpuhost", "ansible")) else 0)


if __name__ == "__main__":
    main()
