"""nginx in front of Triton: rendered config passes the real `nginx -t`; values cannot inject directives."""

import pytest
from pydantic import ValidationError

from plans.nginx import NginxSpec, render
from testbed.servers.nginx import check_config, nginx_available

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


def test_only_the_served_models_inference_api_is_forwarded(tmp_path):
    text = render(NginxSpec(default_model="det.v2", models=("det.v2", "zero")))
    ok, out = check_config(text, tmp_path)
    assert ok, out
    assert "location /v2/ {" not in text and "proxy_pass http://triton_http;" not in text
    assert '"^/v2/models/(det\\.v2|zero)(/versions/[0-9]{1,19})?/infer$"' in text  # '.' is no wildcard
    assert text.count("return 404;") == 2  # HTTP and gRPC fall through to nginx's 404
    assert "location = /inference.GRPCInferenceService/ModelInfer {" in text
    assert "RepositoryModelLoad" not in text and "grpc_pass grpc://triton_grpc;" in text
    # Without a list, the default model alone.
    assert "(yolov8n)" in render(NginxSpec(default_model="yolov8n"))


def test_a_default_model_that_is_not_served_is_refused():
    with pytest.raises(ValidationError, match="not one of the served models"):
        NginxSpec(default_model="a", models=("b",))
    with pytest.raises(ValidationError):
        NginxSpec(default_model="a", models=("a", "b|.*"))
