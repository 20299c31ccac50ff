"""Prometheus metrics of one service process, in a registry of its own.

Counters and the histogram count what this process did since it started; the queue depth and
jobs-by-status gauges are read from the store at scrape time, so they are right across restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

SOLVE_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf"))


class _StoreCollector(Collector):
    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            counts = self._counts()
        except Exception:  # the database is down: /readyz says so; metrics stay up
            return
        depth = GaugeMetricFamily("planner_queue_depth", "Jobs waiting for a worker.")
        depth.add_metric([], counts.get("queued", 0))
        yield depth
        jobs = GaugeMetricFamily("planner_jobs", "Jobs in the store by status.", labels=["status"])
        for status, n in sorted(counts.items()):
            jobs.add_metric([status], n)
        yield jobs


class Metrics:
    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry()
        self.solves = Counter(
            "planner_solves",
            "Solves finished by this process, by final job status.",
            ["status"],
            registry=self.registry,
        )
        self.solve_seconds = Histogram(
            "planner_solve_seconds",
            "Wall seconds of solver processes (start to result).",
            buckets=SOLVE_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "planner_cache_hits",
            "Plan requests answered from the store without solving.",
            registry=self.registry,
        )
        self.submissions = Counter(
            "planner_submissions", "Plan requests accepted (new jobs).", registry=self.registry
        )
        self.registry.register(_StoreCollector(counts))

    def render(self) -> bytes:
        return generate_latest(self.registry)
