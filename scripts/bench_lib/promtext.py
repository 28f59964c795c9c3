"""The control plane's Prometheus metrics, read from outside: scrape, subtract two scrapes,
and estimate quantiles from histogram buckets as Prometheus' histogram_quantile() does."""

from __future__ import annotations

import asyncio
import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# (sample name, sorted label pairs) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


async def scrape(url: str) -> Samples:
    text = await asyncio.to_thread(_fetch, url)
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


@dataclass(frozen=True)
class Histogram:
    """One histogram's counts between two scrapes: cumulative buckets, count and sum."""

    buckets: list[tuple[float, float]]  # (upper bound, cumulative count), +Inf last
    count: float
    total: float

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket holding rank q*count (histogram_quantile)."""
        if not self.count:
            return math.nan
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound  # beyond the last finite bucket: its bound
                inside = cumulative - lower_count
                share = (rank - lower_count) / inside if inside else 0.0
                return lower_bound + (bound - lower_bound) * share
            lower_bound, lower_count = bound, cumulative
        return lower_bound

    def summary(self) -> dict[str, float]:
        return {
            "n": self.count,
            "p50": self.quantile(0.5),
            "p99": self.quantile(0.99),
            "mean": self.mean,
        }


def histogram(before: Samples, after: Samples, name: str, **labels: str) -> Histogram:
    """What `name` (a histogram) observed between the two scrapes."""
    wanted = set(labels.items())

    def buckets(samples: Samples) -> dict[float, float]:
        found: dict[float, float] = {}
        for (n, ls), v in samples.items():
            if n == f"{name}_bucket" and wanted <= set(ls):
                bound = float(dict(ls)["le"])
                found[bound] = found.get(bound, 0.0) + v
        return found

    old, new = buckets(before), buckets(after)
    cumulative = [(b, new[b] - old.get(b, 0.0)) for b in sorted(new)]

    def delta(sample: str) -> float:
        return value(after, sample, **labels) - value(before, sample, **labels)

    return Histogram(cumulative, delta(f"{name}_count"), delta(f"{name}_sum"))
