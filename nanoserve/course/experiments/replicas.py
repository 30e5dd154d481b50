"""Lesson 03's self-check, answered with a price: one replica at batch 2B against two replicas
at batch B, at the same TPOT SLO.

Both use the batch sweep's measured runs: one replica at 2B is the 2B run; two replicas at B are
two copies of the B run on two devices (modelled: separate devices share nothing, so each
serves as the one measured). Cost per request within the SLO is the devices' price per second
over the goodput (vLLM's request goodput), as in lesson 08.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoserve.course.experiments.batching import DecodePoint, goodput_points
from nanoserve.course.table import Table


def replica_table(points: Sequence[DecodePoint], small: int, slos: dict[str, float],
                  price_per_hour: float) -> Table:
    """Rows: 1 replica at B, 1 replica at 2B, 2 replicas at B, under each named TPOT SLO:
    devices, requests/s, median TPOT, goodput and $ per million requests within the SLO."""
    rows = []
    for name, slo in slos.items():
        by = {g.batch: g for g in goodput_points(points, slo)}
        one, big = by[small], by[2 * small]
        for layout, g, devices in ((f"1 replica at B={small}", one, 1),
                                   (f"1 replica at 2B={2 * small}", big, 1),
                                   (f"2 replicas at B={small}", one, 2)):
            goodput = devices * g.goodput
            cost = devices * price_per_hour / 3600 / goodput * 1e6 if goodput else "no goodput"
            rows.append({"SLO": name, "layout": layout,
                         "devices": devices, "requests/s": round(devices * g.throughput, 2),
                         "median TPOT ms": round(1e3 * g.median_tpot, 2),
                         "goodput requests/s": round(goodput, 2),
                         "$ per 1M good requests": cost})
    # the limits in the title: in a column, each row's long SLO text wrapped over five lines
    limits = ", ".join(f"{name} TPOT <= {1e3 * slo:.2f} ms" for name, slo in slos.items())
    return Table(rows, f"One replica at 2B or two at B ({limits}), at ${price_per_hour:.2f} per "
                       "device-hour (runs measured; the second replica modelled as a copy)", ".3g")
