"""`make bench` end to end at smoke size, and the arithmetic its report rests on. No figure
is checked against a time: only that every workload ran and was accounted for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib import peer, promtext, stats  # noqa: E402


@pytest.mark.timeout(110)
def test_quick_bench_runs_every_workload_and_writes_the_results(tmp_path: Path) -> None:
    """THEN the table is printed and bench-results.json holds every AMC workload."""
    out = tmp_path / "bench-results.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 lifecycle" in done.stdout and "5 ceiling" in done.stdout
    doc = json.loads(out.read_text())
    results = doc["results"]
    assert set(results) >= {"ceiling", "lifecycle", "latency", "renewal", "ratios"}
    assert results["lifecycle"]["verified"] is True
    assert results["lifecycle"]["submit_batch"] == 50
    assert results["lifecycle_single"]["verified"] is True
    assert results["lifecycle_single"]["submit_batch"] == 1
    assert results["lifecycle"]["tasks_per_s"]["reps"]
    assert results["latency"]["pickup"]["submit_to_first_action_ms"]["n"] == 20
    assert results["latency"]["cancel"]["cancel_to_cancelled_ms"]["n"] == 20
    assert results["latency"]["cancel"]["returned_to_runner_stopped_ms"]["n"] == 20
    assert results["renewal"]["conflicts"] == 0 and results["renewal"]["renewals_per_s"] > 0
    assert doc["postgres"]["fsync"] == "on" and doc["postgres"]["synchronous_commit"] == "on"


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    """THEN the quantile is read from the bucket deltas between two scrapes."""
    name = "x_seconds"
    before: promtext.Samples = {
        (f"{name}_bucket", (("le", "0.01"),)): 10.0,
        (f"{name}_bucket", (("le", "0.02"),)): 10.0,
        (f"{name}_bucket", (("le", "+Inf"),)): 10.0,
        (f"{name}_count", ()): 10.0,
        (f"{name}_sum", ()): 0.05,
    }
    after: promtext.Samples = {
        (f"{name}_bucket", (("le", "0.01"),)): 14.0,
        (f"{name}_bucket", (("le", "0.02"),)): 18.0,
        (f"{name}_bucket", (("le", "+Inf"),)): 18.0,
        (f"{name}_count", ()): 18.0,
        (f"{name}_sum", ()): 0.17,
    }
    h = promtext.histogram(before, after, name)
    assert h.count == 8
    assert h.quantile(0.5) == pytest.approx(0.01)
    assert h.quantile(0.75) == pytest.approx(0.015)
    assert h.mean == pytest.approx(0.015)


def test_peer_records_become_figures_over_repetitions() -> None:
    """THEN each pgqueuer drain variant gets min / median / max over its repetitions."""
    records = [
        {"kind": "throughput", "variant": "b10", "drain_per_s": v, "version": "1.6.0",
         "verified": True, "drain_cost": {"commits_per_job": 0.3}}
        for v in (5000.0, 6000.0, 5500.0)
    ]  # fmt: skip
    summary = peer.summarize(records)
    assert summary["drain_per_s"]["b10"]["median"] == 5500.0
    assert summary["drain_per_s"]["b10"]["min"] == 5000.0
    assert summary["verified"] is True


def test_percentile_is_a_measured_value() -> None:
    """THEN p50 and p99 are nearest-rank values of the sample."""
    s = stats.summarize([float(i) for i in range(1, 101)])
    assert (s["p50"], s["p99"], s["max"]) == (50.0, 99.0, 100.0)
