#!/usr/bin/env python3
"""Where a held run's tail comes from, read off `idemgate-loadgen --trace`.

For each trace file: the latency percentiles; the slow requests (above
the run's p99, or --slow-ms) grouped into episodes (slow requests due
within --gap-ms of each other), the longest first; how much of the slow
requests' latency the load generator itself added (a connection sent them
late); and whether they recur with a period: for each candidate period
the Rayleigh test of their phases (z = n·R², about 1 for phases spread at
random, above 10 when the slow requests keep coming back at one point of
that period — a periodic task, a timer, a flush).

One stall of a process on the path usually shows as two episodes, one
upstream latency apart: the requests due during the stall, and the ones
due that long before it, whose answers came back during it.

Usage: bench/tail.py TRACE [TRACE ...] [--slow-ms MS] [--gap-ms MS]
"""

import argparse
import cmath
import math
import sys

PERIODS_S = [0.01, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60]


def read(path):
    rows = []
    with open(path) as f:
        header = f.readline().split()
        if header != ["due_us", "send_delay_us", "latency_us", "status"]:
            sys.exit(f"{path}: not an idemgate-loadgen trace (header {header})")
        for line in f:
            due, delay, lat, status = (int(x) for x in line.split())
            rows.append((due, delay, lat, status))
    return rows


def pct(sorted_values, q):
    if not sorted_values:
        return 0
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def episodes(slow, gap_us):
    """Slow requests due within gap_us of the previous one form an episode."""
    out, cur = [], []
    for r in slow:
        if cur and r[0] - cur[-1][0] > gap_us:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    return out


def rayleigh(times_us, period_s):
    n = len(times_us)
    if n == 0:
        return 0.0, 0.0
    period_us = period_s * 1e6
    s = sum(cmath.exp(2j * math.pi * t / period_us) for t in times_us)
    r = abs(s) / n
    phase = (cmath.phase(s) % (2 * math.pi)) / (2 * math.pi) * period_s
    return n * r * r, phase


def report(path, slow_ms, gap_ms):
    rows = read(path)
    answered = [r for r in rows if r[3] != 0]
    lat = sorted(r[2] for r in answered)
    span_s = (rows[-1][0] - rows[0][0]) / 1e6 if len(rows) > 1 else 0
    print(f"== {path}: {len(rows)} requests over {span_s:.1f} s, "
          f"{len(rows) - len(answered)} unanswered, "
          f"{sum(1 for r in answered if not 200 <= r[3] < 300)} non-2xx")
    print("latency ms: p50 {:.2f}  p90 {:.2f}  p99 {:.2f}  p99.9 {:.2f}  max {:.2f}".format(
        *(pct(lat, q) / 1000 for q in (0.5, 0.9, 0.99, 0.999)), (lat[-1] if lat else 0) / 1000))
    threshold = slow_ms * 1000 if slow_ms is not None else pct(lat, 0.99)
    slow = [r for r in answered if r[2] > threshold]
    if not slow:
        print(f"no request above {threshold / 1000:.2f} ms")
        return
    late = sorted(r[1] for r in slow)
    print(f"slow (> {threshold / 1000:.2f} ms): {len(slow)}; sent late by the generator: "
          f"median {pct(late, 0.5) / 1000:.2f} ms, max {late[-1] / 1000:.2f} ms; "
          f"share of their latency that was the generator's: "
          f"{sum(late) / max(1, sum(r[2] for r in slow)):.0%}")
    eps = episodes(slow, gap_ms * 1000)
    sizes = sorted((len(e) for e in eps), reverse=True)
    print(f"episodes (slow requests due within {gap_ms} ms of each other): {len(eps)}; "
          f"the largest hold {', '.join(str(s) for s in sizes[:8])} requests")
    print("  largest: start s   length ms   slow   max ms   median send delay ms")
    for e in sorted(eps, key=len, reverse=True)[:10]:
        delays = sorted(r[1] for r in e)
        print(f"  {e[0][0] / 1e6:15.3f}   {(e[-1][0] - e[0][0]) / 1000:9.1f}   {len(e):4d}   "
              f"{max(r[2] for r in e) / 1000:6.2f}   {pct(delays, 0.5) / 1000:8.2f}")
    # Phases of the episodes' starts, so one long episode counts once.
    starts = [e[0][0] for e in eps]
    print(f"periodicity of the {len(starts)} episode starts (Rayleigh z; > 10 is a period):")
    for p in PERIODS_S:
        if p * 3 > span_s:
            continue
        z, phase = rayleigh(starts, p)
        flag = "  <-- periodic" if z > 10 else ""
        print(f"  period {p:6.2f} s: z = {z:7.1f}  at {phase * 1000:8.1f} ms into it{flag}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--slow-ms", type=float, default=None,
                    help="what counts as slow (default: the run's own p99)")
    ap.add_argument("--gap-ms", type=float, default=5.0,
                    help="slow requests due this close belong to one episode")
    args = ap.parse_args()
    for path in args.traces:
        report(path, args.slow_ms, args.gap_ms)


if __name__ == "__main__":
    main()
