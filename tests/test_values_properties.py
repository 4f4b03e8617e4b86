"""Property tests (hypothesis) for the allow-lists in plans/values.py and the kernel-parameter normaliser.

The GRUB properties source the written file with the real /bin/sh, as update-grub does.
"""

from __future__ import annotations

import string
import subprocess
import urllib.parse

from hypothesis import given, settings
from hypothesis import strategies as st

from plans import values as val
from plans.cmdline import UNSAFE, edit_grub_default, find_value, unsafe_args

SHELL_SPECIAL = set("$`\"'\\;|&<>()*?[]{}!#~ \t\n\r\x00")


def _refused(check, v) -> bool:
    try:
        check(v)
    except ValueError:
        return True
    return False


def _source_grub(text: str) -> str:
    """What update-grub sees: source /etc/default/grub in sh, print GRUB_CMDLINE_LINUX."""
    out = subprocess.run(
        ["sh", "-c", '. /dev/stdin; printf %s "$GRUB_CMDLINE_LINUX"'],
        input=text.encode(),
        capture_output=True,
        check=True,
        timeout=10,
    )
    return out.stdout.decode()


@given(st.text(max_size=40))
def test_kernel_arg_accepts_nothing_a_shell_or_grub_treats_specially(s):
    if not _refused(val.kernel_arg, s):
        assert s and not (set(s) & SHELL_SPECIAL)
        assert val.kernel_arg(s) == s


@given(st.text(alphabet=string.ascii_letters + string.digits + "_.,:/=+@%-", min_size=1, max_size=30))
def test_kernel_arg_accepts_the_usual_characters(s):
    if s[0] not in "_.,:/=+@%-" or s[0] == "_":
        assert val.kernel_arg(s) == s


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.text(
            alphabet=st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), min_size=1, max_size=12
        ).filter(lambda w: w.split() == [w]),
        min_size=1,
        max_size=4,
    )
)
def test_grub_escaping_holds_for_any_word_even_refused_ones(words):
    """Second line of defence: whatever reaches the writer, sourcing the file yields exactly those words."""
    text = edit_grub_default('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX="quiet"\n', add=words, remove=[])
    want = (
        " ".join(["quiet", *dict.fromkeys(words)]) if len({w.split("=", 1)[0] for w in words}) == len(words) else None
    )
    got = _source_grub(text)
    if want is not None:
        assert got == want
    assert find_value(text)[0] == got.split(" ")


_NAME = st.text(alphabet=string.ascii_lowercase + "0123456789_-.", min_size=1, max_size=20)


@given(_NAME, st.text(alphabet=string.ascii_lowercase + "0123456789_-=,", max_size=10))
def test_param_name_treats_dash_and_underscore_alike_in_the_name_only(name, value):
    arg = f"{name}={value}"
    swapped = f"{name.replace('-', '_')}={value}"
    assert val.param_name(arg) == val.param_name(swapped)
    assert val.param_name(val.param_name(arg)) == val.param_name(arg)
    assert "-" not in val.param_name(arg)


@given(st.sampled_from(sorted(UNSAFE)), st.data())
def test_every_spelling_of_an_unsafe_parameter_needs_its_acknowledgement(name, data):
    spelled = "".join(data.draw(st.sampled_from(["-", "_"])) if c in "-_" else c for c in name)
    errs = unsafe_args([f"{spelled}=1"], acknowledged=set())
    assert len(errs) == 1 and UNSAFE[name] in errs[0]
    assert unsafe_args([f"{spelled}=1"], acknowledged={UNSAFE[name]}) == []


@given(st.ip_addresses())
def test_any_ip_address_makes_a_url_whose_host_is_that_address(ip):
    a = val.address(str(ip))
    url = f"http://{val.host_port(a, 8002)}/metrics"
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname == str(ip).lower() and parts.port == 8002


@given(st.text(max_size=30))
def test_addresses_are_ips_or_dns_names(s):
    if not _refused(val.address, s):
        a = val.address(s)
        assert not (set(a) & (SHELL_SPECIAL | {"%", "@", "/"}))


# The checkers of names that land in files and commands.
NAME_CHECKS = (
    val.unix_user,
    val.dns_label,
    val.tuned_profile,
    val.governor,
    val.model_name,
    val.sysctl_name,
    val.mig_profile,
    val.config_key,
)


@given(st.text(max_size=30))
def test_names_that_land_in_files_hold_no_special_characters(s):
    for check in NAME_CHECKS:
        if not _refused(check, s):
            assert not (set(s) & SHELL_SPECIAL), (check.__name__, s)
            assert s not in (".", "..")


@given(st.text(max_size=30))
def test_sysctl_values_are_one_line_without_shell_characters(s):
    if not _refused(val.sysctl_value, s):
        v = val.sysctl_value(s)
        assert "\n" not in v and not (set(v) & (SHELL_SPECIAL - {" "}))


@settings(deadline=None)
@given(st.text(max_size=30), st.sampled_from(["\n", "\r\n", "\x00"]))
def test_no_allow_list_takes_a_value_with_a_line_break_or_nul_after_it(s, tail):
    """fullmatch: `re.match(r"...$")` would let `name\\n` through."""
    for check in (
        *NAME_CHECKS,
        val.kernel_arg,
        val.gpu_model,
        val.image_ref,
        val.abs_path,
        val.address,
        val.ip_address,
    ):
        assert _refused(check, s + tail), (check.__name__, s)


@settings(deadline=None)
@given(st.ip_addresses())
def test_ip_address_takes_any_ip_and_gives_its_normal_form(ip):
    assert val.ip_address(str(ip)) == str(ip)
    assert val.ip_address(str(ip).upper()) == str(ip)


@settings(deadline=None)
@given(st.ip_addresses(v=6), st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=8))
def test_ip_address_refuses_a_zone(ip, zone):
    assert _refused(val.ip_address, f"{ip}%{zone}")


@settings(deadline=None)
@given(
    st.sampled_from(
        [
            "token",
            "access_token",
            "x-amz-signature",
            "X-Amz-Credential",
            "sig",
            "api_key",
            "apiKey",
            "password",
            "client_secret",
            "auth",
            "key",
            "X-Goog-Signature",
            "private-token",
            "passwd",
        ]
    )
)
def test_credential_query_parameters_are_recognised_in_any_case(name):
    assert val.secret_param(name) and val.secret_param(name.upper())


@given(st.sampled_from(["v", "version", "download", "format", "revision", "sha256", "file", "dl", "name"]))
def test_ordinary_query_parameters_are_not_credentials(name):
    assert not val.secret_param(name)
