"""TritonService with the process runtime on the emulated GPU server acting as a serving host (no nested VM).

The component runs under Pulumi mocks to record what it declares (the same inputs `pulumi up` would send); each
child is then applied through the SDK's provider server, in the component's order, against the emulated host:
snapshot → model repository → Triton's systemd unit (numactl-pinned) → the unit enabled and started → nginx
installed (offline: the guest has no network, so Debian's nginx .debs are staged in a directory the SystemPackages
provider installs from) → its config, `nginx -t` on the target, started → one acceptance gate per model through
nginx with binary bodies. Then a deliberately broken model version (its model.py raises on every request) is
deployed the same way: its gate fails, the previous repository and server are put back, and a request checks the
previous version answers again.

Triton itself is the CPU build from the nvidia-pytriton wheel, staged into /opt/tritonserver of the guest (Debian 12
like this machine, so its binary, libraries and python backend run there), with this venv's numpy and the system's
libpython3.11 beside it. The gate reaches nginx through an SSH port forward (the guest's only way in).

Times are printed (pytest -s) and asserted loosely: TCG makes everything slow.
"""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from gate.kserve import signature_request
from plans.triton_model import DynamicBatching, InstanceGroup, ModelSpec, Tensor
from plans.triton_runtime import CONTROL_KEY_PATH, ProcessRuntime, ServerOptions
from testbed.mocks import EchoMocks, RecordingMonitor
from testbed.provider_server import ProviderError, ProviderServer
from testbed.servers.triton import STANDIN_MODEL, triton_available
from tests.progress_lines import tail, waits

# In the devstack session of ./gpuhost.sh test (second_session): six minutes that balance its two chains.
pytestmark = [
    pytest.mark.testhost,
    pytest.mark.second_session,
    pytest.mark.skipif(not triton_available(), reason="no pytriton tritonserver"),
]

OPT = "/opt/tritonserver"
DEBS = "/var/cache/gpuhost/debs"
ROOT = "/srv/triton-repo"
TIMES: dict[str, float] = {}

BROKEN_PY = b"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("version 2 is broken")) for _ in requests]
"""


def echo_spec() -> ModelSpec:
    """A tiny echo model (FP32 [4] in and out, batching up to 4) that runs on a CPU under TCG."""
    return ModelSpec(
        name="echo",
        platform="python",
        max_batch_size=4,
        inputs=[Tensor(name="INPUT0", data_type="FP32", dims=[4])],
        outputs=[Tensor(name="OUTPUT0", data_type="FP32", dims=[4])],
        instance_group=[InstanceGroup(kind="KIND_CPU", count=1)],
        dynamic_batching=DynamicBatching(preferred_batch_size=[2, 4], max_queue_delay_microseconds=500),
    )


# ---------------------------------------------------------------- staging (what an image or package would bring)


def _triton_tarball() -> bytes:
    import numpy
    import pytriton

    dist = Path(pytriton.__file__).resolve().parent / "tritonserver"
    libs = dist.parent.parent / "nvidia_pytriton.libs"
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        tar.add(dist / "bin" / "tritonserver", "bin/tritonserver")
        tar.add(libs, "lib")
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            tar.add(dist / "backends" / "python" / name, f"backends/python/{name}")
        tar.add(
            dist / "python_backend_stubs" / ver / "triton_python_backend_stub",
            "backends/python/triton_python_backend_stub",
        )
        tar.add(f"/usr/lib/x86_64-linux-gnu/libpython{ver}.so.1.0", f"lib/libpython{ver}.so.1.0")
        npdir = Path(numpy.__file__).resolve().parent
        tar.add(npdir, f"python/{npdir.name}", filter=lambda t: None if "/tests" in t.name else t)
        if (npdir.parent / "numpy.libs").is_dir():
            tar.add(npdir.parent / "numpy.libs", "python/numpy.libs")
    return buf.getvalue()


def _nginx_debs(tmp: Path) -> list[Path]:
    """Debian's nginx packages for the guest (no network there): the apt cache's, else `apt-get download`."""
    out = []
    for pkg in ("nginx-common", "nginx"):
        ver = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True).stdout
        arch = "all" if pkg == "nginx-common" else "amd64"
        cached = Path("/var/cache/apt/archives") / f"{pkg}_{ver.replace(':', '%3a')}_{arch}.deb"
        if ver and cached.exists():
            out.append(cached)
            continue
        subprocess.run(["apt-get", "download", pkg], cwd=tmp, check=True, capture_output=True)
        out.append(next(tmp.glob(f"{pkg}_*.deb")))
    return out


# ---------------------------------------------------------------- an SSH port forward to the guest's nginx


class Forward:
    def __init__(self, transport, remote_port: int):
        self.transport, self.remote_port = transport, remote_port
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, peer = self.sock.accept()
            except OSError:
                return
            try:
                chan = self.transport.open_channel("direct-tcpip", ("127.0.0.1", self.remote_port), peer)
            except Exception:
                client.close()
                continue
            for a, b in ((client, chan), (chan, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, EOFError):
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self):
        self.closed = True
        self.sock.close()


# ---------------------------------------------------------------- the component's declared children


def declared(args) -> list:
    """Run TritonService under mocks; its children (type, name, inputs) in registration order."""
    import pulumi

    from components.triton_service import TritonService

    mocks = EchoMocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="gpuhost", stack="testhost", preview=False, monitor=monitor)

    @pulumi.runtime.test
    def program():
        return TritonService("svc", args).repository_digest.apply(lambda d: d)

    program()
    return [r for r in monitor.registrations if r.type.startswith("pulumi-python:dynamic/")]


def service_args(spec, model_py: bytes, nginx_port: int, url: str):
    from components.triton_service import TritonServiceArgs

    return TritonServiceArgs(
        host=HOST[0].host_spec(key_name="sshPrivateKey"),
        gpu_model="generic",
        gpu_count=0,
        models=[spec],
        use_presets=False,
        runtime="process",
        process=ProcessRuntime(binary=f"{OPT}/bin/tritonserver", numa_node=0, env={"LD_LIBRARY_PATH": f"{OPT}/lib"}),
        server=ServerOptions(backend_directory=f"{OPT}/backends", exit_on_error=False),
        model_py=model_py.decode(),
        repository_root=ROOT,
        nginx_debs_dir=DEBS,
        nginx_listen=nginx_port,
        endpoint=url,
        gate_concurrency=2,
        gate_duration_s=5,
        gate_max_requests=400,
        slo_p95_ms=5000,
        gate_ready_timeout_s=600,
        gate_request_timeout_s=120,
    )


HOST: list = []


@pytest.fixture(scope="module")
def serving_host(testhost, tmp_path_factory):
    HOST[:] = [testhost]
    tmp = tmp_path_factory.mktemp("serving-testhost")
    t0 = time.monotonic()
    tarball = _triton_tarball()
    testhost.ssh(f"mkdir -p {OPT} && tar -xzf - -C {OPT} && chmod -R a+rX {OPT}", input=tarball, timeout=1200)
    site = testhost.ssh("python3 -c 'import site; print(site.getsitepackages()[0])'").stdout.strip()
    testhost.ssh(f"mkdir -p {site} && cp -a {OPT}/python/. {site}/")
    testhost.ssh(f"mkdir -p {DEBS}")
    for deb in _nginx_debs(tmp):
        testhost.ssh(f"cat > {DEBS}/{deb.name}", input=deb.read_bytes())
    TIMES["stage_triton_mb"] = round(len(tarball) / 1e6, 1)
    TIMES["stage_s"] = round(time.monotonic() - t0, 1)
    conn = __import__("access.ssh", fromlist=["connect"]).connect(testhost.host_spec())
    fwd = Forward(conn.client.get_transport(), 80)
    yield testhost, f"http://127.0.0.1:{fwd.port}"
    fwd.close()
    print("\nserving testhost times:", TIMES)


def apply_all(srv, children, names_done: dict) -> dict:
    from providers import (
        control_key,
        managed_file,
        service_state,
        serving_snapshot,
        systemd_service,
        triton_gate,
        triton_repository,
    )

    classes = {
        "TritonControlKey": control_key.TritonControlKeyProvider,
        "ServingSnapshot": serving_snapshot.ServingSnapshotProvider,
        "TritonModelRepository": triton_repository.TritonModelRepositoryProvider,
        "ManagedFile": managed_file.ManagedFileProvider,
        "ServiceState": systemd_service.SystemdServiceProvider,
        "SystemPackages": service_state.SystemPackagesProvider,
        "AcceptanceGate": triton_gate.AcceptanceGateProvider,
    }
    outs = {}
    for r in children:
        kind = r.type.rsplit(":", 1)[1]
        res = names_done.get(r.name) or srv.resource(classes[kind](), f"gpuhost:x:{kind}", r.name)
        names_done[r.name] = res
        inputs = {k: v for k, v in r.inputs.items() if k != "__provider"}
        t = time.monotonic()
        outs[r.name] = res.up(inputs)
        TIMES[f"{r.name}_s"] = round(time.monotonic() - t, 1)
    return outs


def test_process_runtime_serves_through_nginx_then_a_broken_version_rolls_back(serving_host, monkeypatch):
    host, url = serving_host
    spec = echo_spec()
    resources: dict = {}
    said: list[str] = []  # the providers' stderr, which the engine shows in `pulumi up`
    monkeypatch.setenv("GPUHOST_PROGRESS_INTERVAL_S", "1")
    with ProviderServer(config={"gpuhost:sshPrivateKey": host.private_key_pem}, on_stderr=said.append) as srv:
        # 1. version 1: installed, started, gated through nginx
        t = time.monotonic()
        v1 = declared(service_args(spec, STANDIN_MODEL.read_bytes(), 80, url))
        outs = apply_all(srv, v1, resources)
        TIMES["deploy_v1_s"] = round(time.monotonic() - t, 1)
        gate = outs["svc-echo-gate"][1]["result"]
        assert gate["requests"] > 0 and gate["error_rate"] == 0, gate
        # Each of the gate's loads (nginx's floor, then the model's) runs gate_duration_s (5 s) unless its
        # max_requests run out first, and the floor load, unchecked, runs in wrk for exactly that time: with the
        # tick at 1 s, the gate said at least once which load it waited for, the time and the bound.
        seen = "\n".join(said)
        loads = waits(seen, "svc-echo-gate", "nginx's floor load on ") + waits(seen, "svc-echo-gate", "the acceptance")
        assert loads, f"no progress line of the gate's loads on the providers' stderr:\n{tail(seen)}"
        TIMES.update({"v1_p50_ms": gate["p50_ms"], "v1_p95_ms": gate["p95_ms"], "v1_rps": gate["throughput_rps"]})
        status = host.ssh("systemctl is-enabled gpuhost-triton nginx; systemctl is-active gpuhost-triton nginx").stdout
        assert status.split() == ["enabled", "enabled", "active", "active"], status
        # numactl execs tritonserver: the running server runs on node 0's CPUs (0-3), its memory bound to node 0.
        pid = host.ssh("systemctl show -p MainPID --value gpuhost-triton").stdout.strip()
        cmd = host.ssh(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
        assert (
            cmd.startswith("/opt/tritonserver/bin/tritonserver ") and "--metrics-config=summary_latencies=true" in cmd
        )
        status = host.ssh(f"grep -E '^Cpus_allowed_list' /proc/{pid}/status").stdout.split()
        assert status == ["Cpus_allowed_list:", "0-3"], status
        # --membind is a memory policy (not a cpuset): numa_maps shows it on the server's mappings.
        assert "bind:0 " in host.ssh(f"cat /proc/{pid}/numa_maps").stdout
        assert "numactl --cpunodebind=0 --membind=0" in host.ssh("systemctl cat gpuhost-triton").stdout.replace('"', "")
        assert "syntax is ok" in host.ssh("nginx -t -c /etc/nginx/nginx.conf 2>&1").stdout
        # Triton on loopback only, its repository API behind the host's key (root 0600, made on the host).
        assert host.ssh(f"stat -c '%a %U' {CONTROL_KEY_PATH}").stdout.split() == ["600", "root"]
        assert "--http-address=127.0.0.1" in cmd, cmd
        probe = (
            'python3 -c "import urllib.request as u, urllib.error as e\n'
            "try: u.urlopen(u.Request('http://127.0.0.1:8000/v2/repository/index', b'{}', method='POST'), timeout=10)"
            '\nexcept e.HTTPError as x: print(x.code)"'
        )
        assert host.ssh(probe).stdout.strip() == "403"

        # 2. version 2 is broken: its gate fails, version 1 is put back and answers again
        t = time.monotonic()
        v2 = declared(service_args(spec, BROKEN_PY, 80, url))
        with pytest.raises(ProviderError) as err:
            apply_all(srv, v2, resources)
        TIMES["deploy_v2_fail_and_rollback_s"] = round(time.monotonic() - t, 1)
        msg = str(err.value)
        assert "is wrong" in msg and "version 2 is broken" in msg, msg
        assert "rolled back to the previous repository and server" in msg and "serves again" in msg, msg
        from components.triton_service import gate_signature
        from providers.triton_gate import checked_request

        sig = gate_signature(spec)
        body, headers = signature_request(sig)
        assert checked_request(f"{url}/v2/models/echo/infer", sig, body, headers) == []
        served = host.ssh(f"cat {ROOT}/echo/1/model.py").stdout.encode()
        assert served == STANDIN_MODEL.read_bytes()

        # 3. back to version 1 in state too, then destroy restores the host
        apply_all(srv, v1, resources)
        for r in reversed(v1):
            resources[r.name].destroy()
    left = host.ssh(
        "systemctl is-active gpuhost-triton nginx || true; ls /etc/systemd/system/gpuhost-triton.service "
        f"{ROOT} {CONTROL_KEY_PATH} 2>&1 || true; dpkg-query -W -f '${{db:Status-Status}}' nginx 2>&1 || true",
        check=False,
    ).stdout
    assert "No such file" in left, left
    assert f"cannot access '{CONTROL_KEY_PATH}': No such file" in left, left  # the key went with Triton
