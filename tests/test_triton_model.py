"""Model specs → config.pbtxt, checked with Triton's ModelConfig protobuf and its semantic rules (pure)."""

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from plans.presets import apply_preset, mps_environment, preset_for
from plans.triton_model import (
    DynamicBatching,
    ModelConfigError,
    ModelSpec,
    Tensor,
    parse_config,
    render_config,
)
from plans.triton_repo import repository_digest, repository_files, resnet50_fp16, sdxl, standin, yolov8n


def _parsed(spec, gpus=1):
    return text_format.Parse(render_config(spec, gpu_count=gpus), pb.ModelConfig())


def test_yolov8n_tensorrt_config_parses_with_triton_protobuf():
    m = _parsed(yolov8n())
    assert m.platform == "tensorrt_plan" and m.max_batch_size == 8
    assert m.input[0].name == "images" and list(m.input[0].dims) == [3, 640, 640]
    assert m.input[0].data_type == pb.TYPE_FP32
    assert list(m.dynamic_batching.preferred_batch_size) == [1, 2, 4, 8]
    assert m.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU and list(m.instance_group[0].gpus) == [0]
    assert m.model_warmup[0].inputs["images"].zero_data


def test_resnet50_fp16_config_parses_with_fp16_and_no_response_cache():
    m = _parsed(resnet50_fp16())
    assert m.input[0].data_type == pb.TYPE_FP16 and m.output[0].data_type == pb.TYPE_FP16
    assert list(m.output[0].dims) == [1000]
    assert not m.response_cache.enable  # it would hide the request-latency summary the p95 alert reads
    assert _parsed(resnet50_fp16().model_copy(update={"response_cache": True})).response_cache.enable
    assert m.instance_group[0].count == 2


def test_sdxl_python_pipeline_config_parses():
    m = _parsed(sdxl())
    assert m.backend == "python" and m.platform == ""
    assert [i.name for i in m.input] == ["prompt", "negative_prompt", "seed", "steps", "guidance_scale"]
    assert m.input[1].optional and m.input[0].data_type == pb.TYPE_STRING
    assert m.dynamic_batching.max_queue_delay_microseconds == 4000
    assert m.parameters["EXECUTION_ENV_PATH"].string_value == "/opt/tritonserver/backends/python"


def test_repository_files_cover_every_model_and_digest_tracks_content():
    files = repository_files([yolov8n(), resnet50_fp16(), sdxl()], gpu_count=1, model_py=b"# pipeline\n")
    assert set(files) == {"yolov8n/config.pbtxt", "resnet50_fp16/config.pbtxt", "sdxl/config.pbtxt", "sdxl/1/model.py"}
    for path, content in files.items():
        if path.endswith(".pbtxt"):
            text_format.Parse(content.decode(), pb.ModelConfig())
    changed = repository_files(
        [yolov8n(max_batch_size=4), resnet50_fp16(), sdxl()], gpu_count=1, model_py=b"# pipeline\n"
    )
    assert repository_digest(files) != repository_digest(changed)
    assert repository_digest(files) == repository_digest(dict(reversed(list(files.items()))))


def test_duplicate_model_names_are_refused():
    with pytest.raises(ValueError, match="unique"):
        repository_files([yolov8n(), yolov8n()], gpu_count=1)


@pytest.mark.parametrize(
    "text, field",
    [
        ('name: "m"\nmax_batch: 8\n', "max_batch"),
        ('name: "m"\ninput [ { name: "x" data_type: TYPE_FP32 dimz: [1] } ]\n', "dimz"),
    ],
)
def test_unknown_field_in_pbtxt_fails_naming_the_field(text, field):
    with pytest.raises(ModelConfigError) as e:
        parse_config(text, "m")
    assert e.value.field == field and field in str(e.value)


def _mutate(spec, **update):
    return ModelSpec.model_validate({**spec.model_dump(by_alias=True), **update})


@pytest.mark.parametrize(
    "spec, gpus, field",
    [
        (yolov8n(), 0, "instance_group[0].kind"),  # KIND_GPU on a host without GPUs
        (yolov8n(), 1, None),
        (_mutate(yolov8n(), instance_group=[{"kind": "KIND_GPU", "gpus": [1]}]), 1, "instance_group[0].gpus[0]"),
        (_mutate(yolov8n(), instance_group=[{"kind": "KIND_CPU"}]), 1, "instance_group[0].kind"),  # TRT on CPU
        (
            _mutate(yolov8n(), dynamic_batching={"preferred_batch_size": [1, 16]}),
            1,
            "dynamic_batching.preferred_batch_size[1]",
        ),  # batch > max
        (_mutate(yolov8n(), max_batch_size=0), 1, "dynamic_batching"),
        (
            _mutate(
                yolov8n(),
                dynamic_batching={"priority_levels": 2, "default_priority_level": 1, "preserve_ordering": True},
            ),
            1,
            "dynamic_batching.preserve_ordering",
        ),
        (
            _mutate(yolov8n(), dynamic_batching={"priority_levels": 2, "default_priority_level": 3}),
            1,
            "dynamic_batching.default_priority_level",
        ),
        (
            _mutate(yolov8n(), inputs=[{"name": "images", "data_type": "FP32", "dims": [3, 0, 640]}]),
            1,
            "input[0].dims[1]",
        ),
        (
            _mutate(
                yolov8n(),
                outputs=[
                    {"name": "a", "data_type": "FP32", "dims": [1]},
                    {"name": "a", "data_type": "FP32", "dims": [1]},
                ],
            ),
            1,
            "output[1].name",
        ),
        (
            _mutate(
                yolov8n(),
                warmup=[
                    {"name": "w", "batch_size": 1, "inputs": {"images": {"data_type": "FP16", "dims": [3, 640, 640]}}}
                ],
            ),
            1,
            "model_warmup[0].inputs[images].data_type",
        ),
        (
            _mutate(
                yolov8n(),
                warmup=[
                    {"name": "w", "batch_size": 9, "inputs": {"images": {"data_type": "FP32", "dims": [3, 640, 640]}}}
                ],
            ),
            1,
            "model_warmup[0].batch_size",
        ),
    ],
)
def test_semantic_rules_fail_naming_the_field(spec, gpus, field):
    if field is None:
        assert render_config(spec, gpu_count=gpus)
        return
    with pytest.raises(ModelConfigError) as e:
        render_config(spec, gpu_count=gpus)
    assert e.value.field == field, str(e.value)
    assert field in str(e.value)


def test_wrong_field_in_spec_is_refused_by_pydantic():
    with pytest.raises(ValueError, match="max_batch"):
        ModelSpec.model_validate({**yolov8n().model_dump(), "max_batch": 8})


def test_standin_keeps_signature_and_batching_but_runs_on_cpu():
    for real in (yolov8n(), resnet50_fp16(), sdxl()):
        cpu = standin(real, sleep_ms=3)
        m = _parsed(cpu, gpus=0)
        r = _parsed(real, gpus=1)
        assert m.backend == "python"
        assert list(m.input) == list(r.input) and list(m.output) == list(r.output)
        assert m.dynamic_batching == r.dynamic_batching and m.max_batch_size == r.max_batch_size
        assert [g.count for g in m.instance_group] == [g.count for g in r.instance_group]
        assert all(g.kind == pb.ModelInstanceGroup.KIND_CPU for g in m.instance_group)
        assert m.parameters["sleep_ms"].string_value == "3.0"


def test_presets_follow_the_seeds_and_explicit_fields_win():
    bare = ModelSpec(
        name="r",
        platform="tensorrt_plan",
        inputs=[Tensor(name="x", data_type="FP16", dims=[3, 224, 224])],
        outputs=[Tensor(name="y", data_type="FP16", dims=[1000])],
    )
    l40s, a10 = apply_preset(bare, "NVIDIA L40S"), apply_preset(bare, "NVIDIA A10")
    assert l40s.dynamic_batching and a10.dynamic_batching
    # seed 004: L40S bigger batches, fewer instances; A10 smaller batches, more instances
    assert max(l40s.dynamic_batching.preferred_batch_size) > max(a10.dynamic_batching.preferred_batch_size)
    assert l40s.instance_group[0].count < a10.instance_group[0].count
    for s in (l40s, a10):
        assert s.dynamic_batching
        assert 500 <= s.dynamic_batching.max_queue_delay_microseconds <= 1000
    diffusion = apply_preset(sdxl(), "NVIDIA H200")
    assert diffusion.dynamic_batching
    assert 2000 <= diffusion.dynamic_batching.max_queue_delay_microseconds <= 6000
    # sdxl sets max_batch_size, dynamic_batching and instance_group itself: kept as given
    assert diffusion.max_batch_size == 2 and diffusion.instance_group == sdxl().instance_group
    partial = ModelSpec(
        name="r",
        platform="tensorrt_plan",
        inputs=bare.inputs,
        outputs=bare.outputs,
        dynamic_batching=DynamicBatching(max_queue_delay_microseconds=700),
    )
    got = apply_preset(partial, "A10")
    assert got.dynamic_batching
    assert got.dynamic_batching.max_queue_delay_microseconds == 700
    assert got.dynamic_batching.preferred_batch_size == preset_for("A10").preferred_batch_size
    assert render_config(got, gpu_count=1)


def test_4090_preset_runs_instances_under_mps_with_split_threads():
    p = preset_for("NVIDIA GeForce RTX 4090")
    envs = [mps_environment(p, i) for i in range(p.instance_count)]
    assert [e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in envs] == ["60", "40"]
    assert all(e["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps" for e in envs)
    assert mps_environment(preset_for("L40S"), 0) == {}
