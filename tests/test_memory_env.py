"""Resident-peak tracking and the environment record."""

from __future__ import annotations

import json

import numpy as np

from fwbench.measure import environment, memory


def test_peak_rss_reset_covers_only_what_follows() -> None:
    block = np.ones(200 * 2**20, dtype=np.uint8)  # 200 MiB touched
    peak_with_block = memory.peak_rss_bytes()
    del block
    assert memory.reset_peak_rss()
    after_reset = memory.peak_rss_bytes()
    assert peak_with_block is not None and after_reset is not None
    assert peak_with_block - after_reset > 150 * 2**20
    again = np.ones(100 * 2**20, dtype=np.uint8)
    peak_with_again = memory.peak_rss_bytes()
    assert peak_with_again is not None and peak_with_again - after_reset > 80 * 2**20
    del again


def test_environment_record_is_flat_json() -> None:
    record = environment.collect()
    assert record["env_schema_version"] == environment.ENV_SCHEMA_VERSION
    assert record["physical_cores"] >= 1 and record["logical_cpus"] >= record["physical_cores"]
    assert record["version_numpy"] == np.__version__
    assert all(not isinstance(v, (dict, list)) for v in record.values())
    json.dumps(record)
