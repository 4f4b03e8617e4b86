"""bench/queue_gpu.py's open-loop arrivals (evenly spaced or Poisson, the same times on both paths), its comma-list
flags refused with the fix, and the overhead table pairing each gateway run with the direct run of the same load and
arrivals, with saturation read as each path's best closed-loop jobs/s."""

from __future__ import annotations

import itertools
import statistics

import pytest

from bench.queue_gpu import WEIGHTS, arrivals, direct_order, overhead_table, parse_list, saturation


def test_poisson_arrivals_are_one_schedule_per_seed_at_the_asked_mean_rate():
    a = arrivals("poisson", 1000, 15, 27)
    assert a == arrivals("poisson", 1000, 15, 27)  # what the direct and the gateway run of a rate both get
    assert a != arrivals("poisson", 1000, 15, 28)
    assert a == sorted(a) and 0 < a[0] and a[-1] < 15
    assert abs(len(a) / 15 - 1000) < 30  # 15,000 expected, sd ~122
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert statistics.mean(gaps) == pytest.approx(1e-3, rel=0.03)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential: CV 1
    slow = arrivals("poisson", 40, 15, 27)
    assert abs(len(slow) / 15 - 40) < 8 and slow != a[: len(slow)]


def test_even_arrivals_are_evenly_spaced_whatever_the_seed():
    a = arrivals("even", 1000, 15, 27)
    assert a == arrivals("even", 1000, 15, 5) and len(a) == 15_000
    assert a[0] == 0 and a[1] == pytest.approx(0.001) and a[-1] == pytest.approx(14.999)
    assert max(y - x for x, y in zip(a, a[1:])) == pytest.approx(min(y - x for x, y in zip(a, a[1:])))


@pytest.mark.parametrize(
    "flag, text, kind, allowed, multiple, fix",
    [
        ("--concurrency", "32,60", int, None, 8, "multiple of --procs 8"),
        ("--concurrency", "32,x", int, None, 8, "positive numbers"),
        ("--arrivals", "even,bursty", str, ("even", "poisson"), 1, "one or more of even, poisson"),
        ("--rates", "1000,-5", float, None, 1, "positive numbers"),
        ("--rates", "", float, None, 1, "positive numbers"),
    ],
)
def test_list_flags_are_refused_with_the_fix(flag, text, kind, allowed, multiple, fix):
    with pytest.raises(SystemExit) as e:
        parse_list(flag, text, kind, allowed, multiple)
    assert flag in str(e.value) and fix in str(e.value)


def test_list_flags_read():
    assert parse_list("--concurrency", "32, 64,128", int, multiple_of=8) == [32, 64, 128]
    assert parse_list("--arrivals", "poisson", str, ("even", "poisson")) == ["poisson"]
    assert parse_list("--rates", "500,1000", float) == [500.0, 1000.0]


def run(path, mode, jobs_per_s, p50, p95, *, rate=None, kind=None, conc=None, offered=None):
    return {
        "offered_per_s": offered,
        "path": path,
        "mode": mode,
        "rate": rate,
        "arrivals": kind,
        "concurrency": conc,
        "jobs_per_s": jobs_per_s,
        "p50_ms": p50,
        "p95_ms": p95,
        "split": {"triton-a": 3, "triton-b": 2},
    }


def test_each_gateway_run_is_compared_with_direct_at_its_own_arrivals_and_saturation_with_each_best():
    runs = [
        run("direct", "open", 999.0, 11.0, 16.0, rate=1000.0, kind="even"),
        run("gateway", "open", 998.0, 12.0, 17.5, rate=1000.0, kind="even"),
        run("direct", "open", 999.0, 13.0, 22.0, rate=1000.0, kind="poisson"),
        run("gateway", "open", 997.0, 13.5, 23.0, rate=1000.0, kind="poisson"),
        run("direct", "closed", 1800.0, 17.0, 25.0, conc=32),
        run("gateway", "closed", 1500.0, 20.0, 30.0, conc=32),
        run("direct", "closed", 2000.0, 31.0, 45.0, conc=64),
        run("gateway", "closed", 1950.0, 32.0, 47.0, conc=64),
        run("direct", "closed", 1990.0, 64.0, 80.0, conc=128),
        run("gateway", "closed", 1900.0, 66.0, 84.0, conc=128),
    ]
    sat = saturation(runs)
    assert sat["direct"]["concurrency"] == 64 and sat["gateway"]["concurrency"] == 64
    assert sat["gateway_share"] == pytest.approx(0.975)
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in overhead_table(runs)[4:]}
    assert "+1.00 | +1.50 | 99.9%" in rows[("open 1000/s", "even")]  # against even direct, not poisson direct
    assert "+0.50 | +1.00 | 99.8%" in rows[("open 1000/s", "poisson")]
    assert rows[("open 1000/s", "even")].endswith("| yes | - |")  # no Triton statistics in these runs
    assert "83.3%" in rows[("closed 32", "-")] and "97.5%" in rows[("closed 64", "-")]
    best = rows[("saturation: best closed", "-")]
    assert "2000.0 jobs/s at 64" in best and "1950.0 jobs/s at 64" in best and "97.5%" in best
    assert not any("saturation: best" in line for line in overhead_table(runs[:6]))  # one concurrency: its own row


def test_an_open_load_is_sustained_against_the_arrivals_drawn_not_the_nominal_rate():
    """Poisson arrivals over a short run are as many as the seed draws (here 2.5/s at a nominal 3/s)."""
    runs = [
        run("direct", "open", 2.5, 300.0, 400.0, rate=3.0, kind="poisson", offered=2.5),
        run("gateway", "open", 2.45, 310.0, 420.0, rate=3.0, kind="poisson", offered=2.5),
        run("direct", "open", 2.95, 300.0, 400.0, rate=3.0, kind="even", offered=3.0),
        run("gateway", "open", 2.5, 900.0, 1400.0, rate=3.0, kind="even", offered=3.0),
    ]
    # Inside Triton, per request: direct 10 ms on both backends; the gateway's 12 ms on a (3 requests) and 14 on b (1)
    runs[2]["triton"] = {n: {"requests": 2, "success_us": 10_000.0} for n in ("triton-a", "triton-b")}
    runs[3]["triton"] = {
        "triton-a": {"requests": 3, "success_us": 11_000.0},
        "triton-b": {"requests": 1, "success_us": 15_000.0},
    }
    rows = [line for line in overhead_table(runs) if line.startswith("| open")]
    assert rows[0].endswith("| yes | - |") and rows[1].endswith("| no: only direct | +2.00 |")


def test_instances_by_weight_give_each_backend_capacity_in_proportion_to_its_weight():
    """--instances-by-weight: triton-a keeps the preset's 3 instances, triton-b (weight 2 of 3) gets 2; without it both
    get the preset's; the rest of the model is the same."""
    from bench.queue_gpu import backend_specs, model_spec

    spec = model_spec(False, "", "jpeg")
    three = spec.model_copy(update={"instance_group": [spec.instance_group[0].model_copy(update={"count": 3})]})
    by_weight = backend_specs(three, True)
    assert {n: s.instance_group[0].count for n, s in by_weight.items()} == {"triton-a": 3, "triton-b": 2}
    assert {n: s.instance_group[0].count for n, s in backend_specs(three, False).items()} == {
        "triton-a": 3,
        "triton-b": 3,
    }
    b = by_weight["triton-b"]
    assert b.model_copy(update={"instance_group": three.instance_group}) == three
    assert three.instance_group[0].count == 3  # the preset's spec itself is not changed


def test_direct_calls_alternate_between_tritons_at_every_arrival_whatever_process_sends_them():
    """Consecutive job numbers (consecutive arrivals) go 3:2 in the finest interleaving, as the gateway's picks do;
    no run of jobs to one Triton longer than the weights make (a, a at the wrap: 2), and every frame size (job % 3)
    reaches each Triton in the 3:2 split."""
    order = direct_order(WEIGHTS)
    assert order == ["triton-a", "triton-b", "triton-a", "triton-b", "triton-a"]
    jobs = [order[j % len(order)] for j in range(15_000)]
    assert jobs.count("triton-a") == 9_000 and jobs.count("triton-b") == 6_000
    longest = max(len(list(g)) for _, g in itertools.groupby(jobs))
    assert longest == 2
    for size in range(3):  # the bench's frames cycle through three sizes by job number
        sent = [b for j, b in enumerate(jobs) if j % 3 == size]
        assert sent.count("triton-a") * 2 == sent.count("triton-b") * 3
