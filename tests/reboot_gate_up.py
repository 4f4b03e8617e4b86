"""One `up` on the emulated GPU server whose output shows a reboot's and an acceptance gate's progress lines
(issue 40 §3; the transcript is in docs/progress-transcript.md).

`./gpuhost.sh up` cannot show both: the dev stack declares no model service, and no stack can declare one that
runs there. Every preset a stack's service takes (plans/triton_repo.py: yolov8n, yolov8n_torch, resnet50_fp16,
sdxl) puts its instances on a GPU (KIND_GPU), and the CPU build of tritonserver the emulated server runs refuses
such a model ("instance group ... has kind KIND_GPU but no GPUs are available"); the stack checks also refuse a
service on a host whose only GPU is passed through to a VM, as the dev host's is.

So this runs what `./gpuhost.sh up` runs without the Pulumi CLI (tools/dev_up.py: the dev stack's config pointed
at a booted emulated server, then the deployment driver's preview and up, printed to stdout), with one difference:
the program is the dev stack's own (`stacks.load.load`) plus one TritonService on the host after its prep and
reboot, declared as tests/test_serving_testhost.py declares it (process runtime, a CPU echo model, nginx from
staged .debs). Before the up it boots its own emulated server (a fresh overlay), stages what an image would bring
(Triton's CPU build, numpy, nginx's .debs; as that test does) and forwards a loopback port to the guest's nginx
port, where the gate reaches it. The server is stopped at the end.

Usage (about 15 min under TCG on two busy cores)::

    .venv/bin/python -m tests.reboot_gate_up | tee /tmp/reboot-gate-up.txt
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "reboot-gate"
PORT_ENV = "GPUHOST_REBOOT_GATE_NGINX_PORT"
OPT = "/opt/tritonserver"
DEBS = "/var/cache/gpuhost/debs"
LOADS = ("nginx's floor load on ", "the acceptance load on ")  # the gate's two loads (providers/triton_gate.py)


def program() -> None:
    """The project's __main__.py: `declare`, and its exports."""
    import pulumi

    for name, value in declare().items():
        pulumi.export(name, value)


def declare() -> dict:
    """The dev stack as __main__.py declares it, then one TritonService on its host; the stack's exports."""
    import pulumi

    from components.passthrough_host import PassthroughHost
    from components.triton_service import TritonService, TritonServiceArgs
    from plans.triton_runtime import ProcessRuntime, ServerOptions
    from stacks.load import load
    from testbed.servers.triton import STANDIN_MODEL
    from tests.test_serving_testhost import echo_spec

    stack = load(pulumi.Config("gpuhost"))
    prep = next(p for p in stack.components if p.cls is PassthroughHost)
    port = int(os.environ[PORT_ENV])
    args = TritonServiceArgs(
        host=prep.args.host,
        gpu_model="generic",
        gpu_count=0,
        models=[echo_spec()],
        use_presets=False,
        runtime="process",
        process=ProcessRuntime(binary=f"{OPT}/bin/tritonserver", numa_node=0, env={"LD_LIBRARY_PATH": f"{OPT}/lib"}),
        server=ServerOptions(backend_directory=f"{OPT}/backends", exit_on_error=False),
        model_py=STANDIN_MODEL.read_text(),
        nginx_debs_dir=DEBS,
        nginx_listen=port,
        endpoint=f"http://127.0.0.1:{port}",
        gate_concurrency=2,
        gate_duration_s=12,
        gate_max_requests=5000,
        slo_p95_ms=5000,
        gate_ready_timeout_s=600,
        gate_request_timeout_s=120,
    )
    # after the host's prep and reboot, as stacks.program puts a service after its host
    stack.add(TritonService, "svc", args, [prep], "tests/reboot_gate_up.py")
    return stack.declare()


def stage(host, tmp: Path) -> None:
    """What an image or package would bring: Triton's CPU build under /opt/tritonserver, numpy for its python
    backend, nginx's .debs (the guest has no network)."""
    from tests.test_serving_testhost import _nginx_debs, _triton_tarball

    t = time.monotonic()
    host.ssh(f"mkdir -p {OPT} && tar -xzf - -C {OPT} && chmod -R a+rX {OPT}", input=_triton_tarball(), timeout=1200)
    site = host.ssh("python3 -c 'import site; print(site.getsitepackages()[0])'").stdout.strip()
    host.ssh(f"mkdir -p {site} && cp -a {OPT}/python/. {site}/")
    host.ssh(f"mkdir -p {DEBS}")
    for deb in _nginx_debs(tmp):
        host.ssh(f"cat > {DEBS}/{deb.name}", input=deb.read_bytes())
    print(f"== staged Triton, numpy and nginx's .debs in {time.monotonic() - t:.0f} s", flush=True)


def project(tmp: Path) -> Path:
    """The repository's files under `tmp`, with __main__.py running `program`."""
    proj = tmp / "project"
    proj.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in ("__main__.py", ".git", ".pulumi-state"):
            (proj / entry.name).symlink_to(entry)
    (proj / "__main__.py").write_text("from tests.reboot_gate_up import program\n\nprogram()\n")
    return proj


def main() -> int:
    from testbed.servers import free_port
    from testbed.testhost.image import cache_root, ensure_image
    from testbed.testhost.machine import SshKey, TestHost, hmp
    from tests.progress_lines import Display
    from tools.dev_up import PASSPHRASE
    from tools.driver import Driver, StackConfig

    d = cache_root() / "run" / NAME
    host = TestHost(ensure_image(), d, SshKey.generate(d / "key"), name=NAME)
    print(f"== booting the emulated GPU server {NAME} (QEMU; a few minutes under TCG)", flush=True)
    host.start()
    try:
        print(f"== up in {host.timings['boot_s']} s, SSH on 127.0.0.1:{host.port}", flush=True)
        with tempfile.TemporaryDirectory(prefix="reboot-gate-") as t:
            tmp = Path(t)
            stage(host, tmp)
            port = free_port()
            hmp(d / "qmp.sock", f"hostfwd_add net0 tcp:127.0.0.1:{port}-:{port}")
            os.environ[PORT_ENV] = str(port)
            cfg = StackConfig.load(ROOT, "dev", PASSPHRASE)
            fleet = json.loads(cfg.values["gpuhost:fleet"])
            fleet["hosts"][0]["ssh"].update(port=host.port, host_key=host.host_key_line)
            cfg = cfg.with_values(fleet=fleet, sshPrivateKey=host.private_key_pem)
            if "gpuhost:sshPrivateKey" not in cfg.secret_keys:
                cfg.secret_keys.append("gpuhost:sshPrivateKey")
            shown = Display()
            drv = Driver(project(tmp), "dev", passphrase=PASSPHRASE, config=cfg, state=tmp / "dev.json", out=shown)
            if drv.preview().errors:
                return 1
            start = len(shown.getvalue())
            if drv.up().errors:
                return 1
            return verdict(shown.getvalue()[start:])
    finally:
        host.stop()
        shutil.rmtree(d, ignore_errors=True)
        print(f"== stopped {NAME}", flush=True)


def verdict(seen: str) -> int:
    """0 when up's output has progress lines of both the reboot and the gate (tests/progress_lines.py)."""
    from tests.progress_lines import tail, waits

    row = "pulumi:pulumi:Stack  gpuhost-dev"
    reboot = waits(seen, "emulated-gpu-01-reboot", "emulated-gpu-01 to come back from its reboot", row)
    gate = [ln for what in LOADS for ln in waits(seen, "svc-echo-gate", what, row)]
    print(f"== progress lines in up's output: {len(reboot)} of the reboot, {len(gate)} of the gate", flush=True)
    if reboot and gate:
        return 0
    print(f"== missing; up's output ends:\n{tail(seen)}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
