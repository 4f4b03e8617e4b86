"""Second line of defence: providers used on their own refuse what the stack loader refuses (same allow-lists)."""

import pytest

from providers.kernel_cmdline import KernelCmdlineProvider
from providers.sysctls import SysctlsProvider
from providers.tuning import HostTuningProvider

HOST = {"name": "x", "address": "10.0.0.5", "host_key": "ssh-ed25519 " + "A" * 68}


@pytest.mark.parametrize(
    "provider, news, prop, words",
    [
        (KernelCmdlineProvider(), {"add": ["x=$(id)"], "remove": []}, "add", "may hold only"),
        (KernelCmdlineProvider(), {"add": [], "remove": ["a=`id`"]}, "remove", "may hold only"),
        (KernelCmdlineProvider(), {"add": ["pcie-acs-override=downstream"], "remove": []}, "add", "weakens isolation"),
        (SysctlsProvider(), {"values": {"net.core.x\nkernel.y": "1"}}, "values.net.core.x\nkernel.y", "line break"),
        (SysctlsProvider(), {"values": {"net.core.somaxconn": "$(id)"}}, "values.net.core.somaxconn", "may hold only"),
        (HostTuningProvider(), {"tuned_profile": "x;reboot"}, "tuned_profile", "may hold only"),
        (HostTuningProvider(), {"governor": "perf`id`"}, "governor", "may hold only"),
    ],
)
def test_provider_check_refuses_what_the_loader_refuses(provider, news, prop, words):
    failures = provider.check_known({}, {"host": HOST, **news}).failures
    assert [f.property for f in failures] == [prop] and words in failures[0].reason
