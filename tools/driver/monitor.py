"""The gRPC services the program talks to: the resource monitor and the engine (log, root resource)."""

from __future__ import annotations

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import (
    engine_pb2,
    engine_pb2_grpc,
    resource_pb2,
    resource_pb2_grpc,
)

from tools.driver.deployment import BuiltinError, Deployment, StepFailed
from tools.driver.provider import ProviderError


class Monitor(resource_pb2_grpc.ResourceMonitorServicer):
    """The engine's resource monitor as the Python SDK uses it (sdk/proto/resource.proto)."""

    def __init__(self, dep: Deployment):
        self.dep = dep

    # source_eval.go supportsFeatureID answers yes to more; the driver says yes only to what it implements, so the
    # SDK refuses the rest clearly (e.g. "does not support the DeletedWith option") instead of it being ignored.
    FEATURES = {
        "secrets": resource_pb2.RESOURCE_MONITOR_FEATURE_SECRETS,
        "resourceReferences": resource_pb2.RESOURCE_MONITOR_FEATURE_RESOURCE_REFERENCES,
    }

    def SupportsFeature(self, request, context):
        return resource_pb2.SupportsFeatureResponse(hasSupport=request.id in self.FEATURES)

    def GetDeploymentInfo(self, request, context):
        d = self.dep.d
        cfg = d.config()
        return resource_pb2.DeploymentInfo(
            project=d.project,
            stack=d.stack,
            organization="organization",
            config=cfg.values,
            configSecretKeys=cfg.secret_keys,
            dryRun=self.dep.dry_run,
            parallel=d.parallel,
            supportedFeatures=[
                *self.FEATURES.values(),
                resource_pb2.RESOURCE_MONITOR_FEATURE_INVOKE_DEPENDS_ON,
                resource_pb2.RESOURCE_MONITOR_FEATURE_INVOKE_PARENT,
            ],
        )

    def RegisterResource(self, request, context):
        try:
            return self.dep.register(request)
        except StepFailed as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        except Exception as e:  # noqa: BLE001 -- a driver bug must not hang the program
            import traceback

            self.dep.outcome.errors.append(f"driver: {e}\n{traceback.format_exc()}")
            self.dep.failed = True
            context.abort(grpc.StatusCode.INTERNAL, str(e))

    def RegisterResourceOutputs(self, request, context):
        self.dep.outputs(request)
        return empty_pb2.Empty()

    def Invoke(self, request, context):
        try:
            return self.dep.invoke(request)
        except BuiltinError as e:
            context.abort(grpc.StatusCode.UNKNOWN, f"invocation of {request.tok} returned an error: {e}")

    def ReadResource(self, request, context):
        try:
            return self.dep.read_resource(request)
        except StepFailed as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        except (BuiltinError, ProviderError) as e:
            with self.dep.lock:  # a failed read fails the run like any step (step_executor.go cancelDueToError)
                self.dep.failed = True
                self.dep.outcome.errors.append(f"{request.name}: read failed: {e}")
            context.abort(grpc.StatusCode.UNKNOWN, str(e))

    def SignalAndWaitForShutdown(self, request, context):
        return empty_pb2.Empty()

    def RegisterStackTransform(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "transforms are not supported by the driver")


class Engine(engine_pb2_grpc.EngineServicer):
    def __init__(self, dep: Deployment):
        self.dep = dep
        self.root = ""

    def Log(self, request, context):
        sev = {
            engine_pb2.DEBUG: "debug",
            engine_pb2.INFO: "info",
            engine_pb2.WARNING: "warning",
            engine_pb2.ERROR: "error",
        }.get(request.severity, "info")
        msg = request.message.rstrip()
        self.dep.d.logs.append(f"{sev}: {msg}")
        if sev == "error":
            with self.dep.lock:
                self.dep.outcome.errors.append(msg)
        if sev in ("warning", "error", "info"):
            self.dep.d.emit(f"  {sev}: {msg}")
        return empty_pb2.Empty()

    def GetRootResource(self, request, context):
        return engine_pb2.GetRootResourceResponse(urn=self.root)

    def SetRootResource(self, request, context):
        self.root = request.urn
        return engine_pb2.SetRootResourceResponse()
