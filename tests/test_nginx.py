"""nginx in front of Triton: rendered config passes the real `nginx -t`; values cannot inject directives."""

import pytest
from pydantic import ValidationError

from plans.nginx import NginxSpec, render
from tests.servers.nginx import check_config, nginx_available

pytestmark = pytest.mark.skipif(not nginx_available(), reason="nginx is not installed")


def test_production_config_passes_real_nginx_t(tmp_path):
    text = render(NginxSpec(default_model="yolov8n"))
    ok, out = check_config(text, tmp_path)
    assert ok, out
    for directive in (
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_request_buffering off;",
        "client_max_body_size 64m;",
        "keepalive 64;",
        "grpc_pass grpc://triton_grpc;",
        "keepalive_requests 100000;",
        "proxy_pass http://triton_http/v2/models/yolov8n/infer;",
        # A 640x640 uint8 image (1.2 MB) in and a raw YOLOv8n output (1.4 MB) out stay in memory, never a temp file.
        "client_body_buffer_size 2m;",
        "proxy_buffers 32 64k;",
        "proxy_max_temp_file_size 0;",
        "grpc_buffer_size 2m;",
        "http2_body_preread_size 2m;",
    ):
        assert directive in text


def test_nginx_t_rejects_a_broken_config(tmp_path):
    text = render(NginxSpec(default_model="yolov8n")).replace("keepalive 64;", "keepalive sixty-four;")
    ok, out = check_config(text, tmp_path)
    assert not ok and "keepalive" in out


@pytest.mark.parametrize(
    "field, value",
    [
        ("default_model", "m; return 500"),
        ("upstream_http", "a b:1"),
        ("client_max_body_size", "64m; x"),
        ("prefix", "/tmp/x;y"),
    ],
)
def test_values_that_would_inject_directives_are_refused(field, value):
    with pytest.raises(ValidationError) as e:
        NginxSpec(**{"default_model": "m", field: value})
    assert field in str(e.value)
