"""The demo's pipeline (``jobs/span_stats.py`` driven by ``scripts/demo.py``) on a small data set:
every complete (service, minute) is written once with exactly its spans, and the backward query
answers the newest error spans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scripts.demo import generate_spans, prepare_streams, run_pipeline, show_results
from tests.support.server import ServerProcess

from tidelog.client import Client

pytestmark = pytest.mark.spark


@pytest.mark.slow
def test_the_span_pipeline_writes_each_complete_minute_once(
    spark: Any, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    spans = generate_spans(3000, minutes=6, seed=11)
    prepare_streams(client)
    for start in range(0, len(spans.messages), 500):
        client.publish_batch(
            "spans", spans.messages[start : start + 500], partition=(start // 500) % 2
        )
    watermark_ms = run_pipeline(server.address, tmp_path / "checkpoint", len(spans.messages))
    assert watermark_ms is not None
    assert spans.expected_stats(watermark_ms)  # some minutes are complete
    assert show_results(client, spans, watermark_ms)
    # A second run from the same checkpoint has nothing new to write.
    before = client.stream_info("spans.stats").partitions[0].newest_offset
    run_pipeline(server.address, tmp_path / "checkpoint", 0)
    assert client.stream_info("spans.stats").partitions[0].newest_offset == before
