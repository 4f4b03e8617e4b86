"""./gpuhost.sh as a user meets it: help for every command, unknown commands refused, and set-up skipped only when
the venv really has every pin (read from the installed metadata)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "gpuhost.sh"), *args], capture_output=True, text=True, timeout=60)


def test_help_names_every_command_and_each_commands_help_is_the_same_text():
    r = _sh("--help")
    assert r.returncode == 0
    for cmd in ("test [PYTEST ARGS]", "up ", "lint ", "setup ", "help "):
        assert f"\n  {cmd}" in r.stdout, cmd
    assert "./gpuhost.sh test tests/test_nginx.py -k allowlist" in r.stdout
    for args in (("help",), ("-h",), ("up", "--help"), ("lint", "-h"), ("test", "--help"), ("setup", "--help")):
        assert _sh(*args).stdout == r.stdout, args  # never runs the command itself


def test_an_unknown_command_is_refused_with_the_usage():
    r = _sh("deploy")
    assert r.returncode == 2 and r.stderr.startswith("usage: ./gpuhost.sh COMMAND")


def _pins(venv: str, req: Path) -> int:
    script = f'source <(sed -n "/^pins_installed()/,/^}}/p" {ROOT / "gpuhost.sh"}); pins_installed {venv} {req}'
    return subprocess.run(["bash", "-c", script], timeout=60).returncode


def test_set_up_is_skipped_only_when_every_pin_is_installed(tmp_path):
    venv = str(ROOT / ".venv")
    assert _pins(venv, ROOT / "requirements.txt") == 0  # this venv was made from it (torch's +cpu local tag too)
    wrong = tmp_path / "req.txt"
    wrong.write_text("pytest==0.0.1\n")
    assert _pins(venv, wrong) == 1
    wrong.write_text("no-such-distribution-gpuhost==1.0\n")
    assert _pins(venv, wrong) == 1
    assert _pins(str(tmp_path / "no-venv"), ROOT / "requirements.txt") != 0  # no venv: installs
