"""``benchmarks.delta_append``'s variants: the writer's settings where it says so."""

from __future__ import annotations

import pytest

from benchmarks.delta_append import VARIANTS, _resolve, main
from spark_ext.l4.writers.spark import QUERY_CONFS, STATS_PROPERTY


def test_the_writer_variant_has_the_writer_s_settings_and_the_defaults_none():
    confs, props = _resolve("writer")
    assert confs == QUERY_CONFS and props == {STATS_PROPERTY: "enqueue_ts,answered_ts"}
    assert _resolve("delta-defaults") == ({}, {})
    assert _resolve("stats-time-columns") == ({}, props)
    assert _resolve("no-checksum") == (QUERY_CONFS, {})
    assert set(VARIANTS) >= {"delta-defaults", "writer"}


def test_an_unknown_variant_is_refused_before_spark_starts(capsys):
    with pytest.raises(SystemExit):
        main(["--variants", "writer,fastest"])
    assert "unknown variants ['fastest']" in capsys.readouterr().err
