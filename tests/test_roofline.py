"""The roofline of course.cost_model (program 03 draws it as figures/roofline.png)."""
from __future__ import annotations

import math

from course import cost_model as cm


def test_the_roof_is_min_of_peak_and_bandwidth_times_intensity():
    g = cm.H100
    assert math.isclose(cm.attainable_flops(g.ridge, g), g.peak_fp16_flops)
    assert math.isclose(cm.attainable_flops(10.0, g), 10.0 * g.hbm_bandwidth)
    assert cm.attainable_flops(1e6, g) == g.peak_fp16_flops


def test_the_points_are_the_section_5_5_kernels():
    rows = {r["name"]: r for r in cm.h100_forward_estimate()}
    points = cm.roofline_points()
    assert {p["name"] for p in points} == {n for n, r in rows.items() if r["flops"] and r["launches"] == 1}
    for p in points:
        r = rows[p["name"]]
        assert math.isclose(p["intensity"], r["flops"] / r["bytes"])
        assert p["bound"] == r["bound"], "the side of the ridge agrees with the estimate's bound"
    by = {p["name"].split(":")[0].split(",")[0]: p for p in points}
    # standard QK^T: 2N²d FLOPs over (2Nd + N²)·2 bytes = 120.5 FLOP/B at N = 4096, d = 128: memory bound
    assert math.isclose(by["standard kernel 1"]["intensity"], 2 * 4096**2 * 128 / ((2 * 4096 * 128 + 4096**2) * 2))
    assert by["standard kernel 1"]["bound"] == "memory"
    flash_l2 = next(p for p in points if "L2" in p["name"])
    assert flash_l2["bound"] == "compute" and flash_l2["intensity"] > 6 * cm.H100.ridge
