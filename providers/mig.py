"""MigLayout: MIG partitions declared per GPU, applied assert-then-apply like mig-parted (seed 001 route A).

Inputs: host, layout ({"0": ["2g.20gb", "2g.20gb", "1g.10gb"]}), version. Check reads the GPUs (one round trip) and
refuses a profile this GPU model does not offer, naming the ones it does. Create/update apply only the difference
(enable MIG, destroy/create GPU+compute instances by profile ID); a mode change that needs a GPU reset is reported
in `pending_reset`. Outputs: mig_uuids per GPU (for Triton instances), prior layout; delete restores it.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, ReadResult, UpdateResult

from access.shell import Script
from plans import triton_mig as mig
from providers.base import HostProvider, HostResource


def _layout(props: dict) -> dict[int, list[str]]:
    return {int(k): list(v) for k, v in (props.get("layout") or {}).items()}


class MigLayoutProvider(HostProvider):
    VERSION = "1"
    KIND = "mig"
    OUTPUT_ONLY = ("mig_uuids", "pending_reset", "prior_layout")

    def _state(self, props: dict) -> list[mig.Gpu]:
        return mig.parse_state(self.conn(props).run(mig.FACT_SCRIPT).stdout)

    def check_known(self, olds: dict, news: dict) -> CheckResult:
        failures = self.check_host(news)
        if failures:
            return CheckResult(news, failures)
        try:
            mig.plan(self._state(news), _layout(news))
        except ValueError as e:
            failures.append(CheckFailure("layout", str(e)))
        return CheckResult(news, failures)

    def _converge(self, props: dict, prior: Optional[dict]) -> dict:
        gpus = self._state(props)
        if prior is None:
            prior = {
                str(g.index): (list(g.instances) if g.mig_current else []) for g in gpus if g.index in _layout(props)
            }
        actions = mig.plan(gpus, _layout(props))
        if actions:
            self.conn(props).run(Script().raw("set -e").extend(a.command for a in actions).render())
            gpus = self._state(props)
        return self.outputs(
            props,
            prior_layout=prior,
            pending_reset=[g.index for g in gpus if g.mig_pending and not g.mig_current],
            mig_uuids={str(i): mig.mig_uuids(gpus, i) for i in _layout(props)},
        )

    def update(self, _id: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult(self._converge(news, olds.get("prior_layout")))

    def read(self, id_: str, props: dict) -> ReadResult:
        gpus = self._state(props)
        return ReadResult(
            id_,
            {
                **props,
                "layout": {
                    str(g.index): list(g.instances) for g in gpus if str(g.index) in (props.get("layout") or {})
                },
            },
        )

    def delete(self, _id: str, props: dict) -> None:
        prior = {int(k): v for k, v in (props.get("prior_layout") or {}).items()}
        actions = mig.plan(self._state(props), prior)
        if actions:
            self.conn(props).run(Script().raw("set -e").extend(a.command for a in actions).render())


class MigLayout(HostResource, module="gpu", name="MigLayout"):
    mig_uuids: pulumi.Output[dict]

    PROVIDER = MigLayoutProvider
