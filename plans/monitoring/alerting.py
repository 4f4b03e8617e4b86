"""What the alerting rule files here share: numbers and label sets as PromQL writes them, promtool test cases.

Usage::

    case = promtool_case("1m", [("DCGM_FI_DEV_XID_ERRORS" + series_labels(gpu), "0 0 79 79")], rule,
                         [("1m", []), ("2m", [expected_alert])])
"""

from __future__ import annotations

from typing import Any


def fmt(x: float) -> str:
    """A number as PromQL and the annotations write it: no trailing zeros (2.5, 1500, 1e+39)."""
    return f"{x:g}"


def series_labels(d: dict[str, str]) -> str:
    """A label set in series notation: {job="x",host="y"}."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"


def promtool_case(
    interval: str, series: list[tuple[str, str]], rule: dict[str, Any], checks: list[tuple[str, list]]
) -> dict[str, Any]:
    """A promtool rule test case: the input `series` (name with labels, values in promtool's notation) sampled every
    `interval`, and at each (eval time, alerts) of `checks` the alerts of `rule` expected firing then."""
    return {
        "interval": interval,
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [{"eval_time": t, "alertname": rule["alert"], "exp_alerts": exp} for t, exp in checks],
    }
