"""MigLayout: a MIG layout per GPU, applied assert-then-apply like mig-parted (seed 001 route A).

Inputs: host, layout ({"0": ["2g.20gb", "2g.20gb", "1g.10gb"]}: profiles per GPU index), version. Check reads the
GPUs (one round trip) and refuses a profile this GPU model does not offer, naming the ones it does. Create/update
apply only the difference (``plans.mig.plan_layout``: MIG mode on, instances destroyed and created by profile ID);
a mode change that needs a GPU reset is reported in `pending_reset`. Outputs: `mig_uuids`, the MIG UUIDs of each
GPU's instances (for Triton), and the prior layout; delete restores it. The words are plans/mig.py's.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi.dynamic import CheckFailure

from plans import mig
from pristine import Change, Record
from providers.base import HostResource, TemplateProvider
from providers.effects import Effect, host_name


def _layout(props: dict) -> dict[int, list[str]]:
    return {int(k): list(v) for k, v in (props.get("layout") or {}).items()}


class MigLayoutProvider(TemplateProvider):
    VERSION = "2"  # 2: on the template; the GPUs' MIG state as first found is recorded on the host
    KIND = "mig"
    INPUTS = ("host", "layout")
    OUTPUT_ONLY = ("mig_uuids", "pending_reset", "prior_layout")

    def effects(self, olds: dict | None, news: dict) -> list[Effect]:
        # Another layout destroys the GPU's instances and creates the new ones: work running on them stops.
        if olds is None:
            return []
        old, new = _layout(olds), _layout(news)
        how = "MIG instances destroyed and created again (work on them stops)"
        return [
            Effect("restart", host_name(news), f"GPU {i}", how)
            for i in sorted(set(old) | set(new))
            if old.get(i) != new.get(i)
        ]

    def _state(self, props: dict) -> list[mig.Gpu]:
        conn = self.conn(props)
        return mig.parse_state(self.guarded(conn, "reading the GPUs", lambda: conn.run(mig.FACT_SCRIPT).stdout))

    def validate(self, news: dict) -> list[CheckFailure]:
        if self.check_host(news):
            return []
        try:
            mig.plan_layout(self._state(news), _layout(news))
        except ValueError as e:
            return [CheckFailure("layout", str(e))]
        return []

    def _record(self, props: dict) -> Record:
        return Record(self.owner(props), values={"mig/state": mig.FACT_SCRIPT})

    def _run(self, props: dict, actions: list[mig.Action], ch: Optional[Change] = None) -> None:
        conn = self.conn(props)
        ch = (ch or Change(self.owner(props))).add(a.command for a in actions)
        if not ch.empty:
            self.guarded(conn, "; ".join(a.why for a in actions) or "MIG", lambda: ch.run(conn), changing=True)

    def apply(self, props: dict, prior: Optional[dict]) -> dict:
        conn = self.conn(props)
        _, _, first = self.record_and_read(conn, props, self._record(props), "")
        found = (prior or {}).get("prior_layout")
        if found is None:
            was = mig.parse_state(first.get("mig/state", ""))
            found = {
                str(g.index): (list(g.instances) if g.mig_current else []) for g in was if g.index in _layout(props)
            }
        gpus = self._state(props)
        actions = mig.plan_layout(gpus, _layout(props))
        if actions:
            self._run(props, actions)
            gpus = self._state(props)
        return {
            "prior_layout": found,
            "pending_reset": [g.index for g in gpus if g.mig_pending and not g.mig_current],
            "mig_uuids": {str(i): mig.instance_uuids(gpus, i) for i in _layout(props)},
        }

    def observe(self, props: dict) -> dict:
        want = props.get("layout") or {}
        return {"layout": {str(g.index): list(g.instances) for g in self._state(props) if str(g.index) in want}}

    def restore(self, props: dict) -> Change:
        prior = {int(k): v for k, v in (props.get("prior_layout") or {}).items()}
        actions = mig.plan_layout(self._state(props), prior)
        return Change(self.owner(props)).add(a.command for a in actions).forget(self._record(props))


class MigLayout(HostResource, module="gpu", name="MigLayout"):
    mig_uuids: pulumi.Output[dict]

    PROVIDER = MigLayoutProvider
