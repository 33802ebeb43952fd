"""The chaos run's seeded schedule and its figures' arithmetic."""

from __future__ import annotations

import random

from chaos.audit import percentile
from chaos.controller import fault_schedule
from chaos.workflows import KINDS, definitions, params_for


def test_a_seed_names_one_fault_schedule_and_one_workflow_mix() -> None:
    def plan(seed: int) -> tuple[object, object]:
        faults = fault_schedule(
            random.Random(seed), duration=600, workers=3, mean_gap=20, proxies=True
        )
        rng = random.Random(seed)
        return faults, [params_for(rng) for _ in range(50)]

    assert plan(3) == plan(3)
    assert plan(3) != plan(4)
    faults, mix = plan(3)
    assert {f.action for f in faults} >= {"kill_worker", "pause_worker"}  # type: ignore[attr-defined]
    assert {kind for kind, _ in mix} == {f"chaos_{k}" for k in KINDS}  # type: ignore[misc]


def test_without_a_proxy_no_proxy_fault_is_scheduled() -> None:
    faults = fault_schedule(random.Random(1), duration=3600, workers=2, mean_gap=10, proxies=False)
    assert "proxy_fault" not in {f.action for f in faults}


def test_every_kind_has_a_definition() -> None:
    # and the fan-out's partitions run as sub-workflows of their own
    assert {d["name"] for d in definitions()} == {f"chaos_{k}" for k in KINDS} | {"chaos_part_one"}


def test_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.5
    assert percentile(values, 99) == 99.01
    assert percentile([], 50) == 0.0
