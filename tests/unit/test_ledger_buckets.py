"""The ledger's buckets (:mod:`spark_ext.l4.buckets`): one per shuffle partition, each
on its own partition, kept by the checkpoint that chose them (no Spark: Spark's own
hash is checked against these values in ``tests/process/test_ledger_buckets.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ext.l4.buckets import (KEYS_FILE, LEGACY_KEYS, bucket_keys, checkpoint_bucket_keys,
                                  spark_int_hash)


def test_the_hash_is_sparks_murmur3_of_an_int() -> None:
    # Spark 4.2: SELECT hash(0), hash(1), hash(2), hash(-1), hash(123456789)
    assert [spark_int_hash(v) for v in (0, 1, 2, -1, 123456789)] == [
        933211791, -559580957, 1765031574, -1604776387, -598405280]


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 8, 16])
def test_each_bucket_lands_on_its_own_partition(partitions: int) -> None:
    keys = bucket_keys(partitions)
    assert len(keys) == partitions
    assert [spark_int_hash(k) % partitions for k in keys] == list(range(partitions))
    # the smallest such key: no smaller integer lands on that partition
    for p, key in enumerate(keys):
        assert all(spark_int_hash(v) % partitions != p for v in range(key))


def test_the_first_integers_do_not_spread_which_is_why_the_keys_are_chosen() -> None:
    assert len({spark_int_hash(v) % 2 for v in range(2)}) == 1  # 0 and 1: one partition
    assert bucket_keys(2) == (2, 0)


def test_a_new_checkpoint_keeps_the_keys_it_chose(tmp_path: Path) -> None:
    checkpoint = str(tmp_path / "answers")
    assert checkpoint_bucket_keys(None, checkpoint, partitions=2, new_run=True) == (2, 0)
    assert (tmp_path / "answers" / KEYS_FILE).read_text().strip() == "2,0"
    # restarted on a machine with more task slots: the checkpoint's keys stay
    assert checkpoint_bucket_keys(None, checkpoint, partitions=8, new_run=False) == (2, 0)
    # a new run of the same folder (its offsets gone) chooses again
    assert checkpoint_bucket_keys(None, checkpoint, partitions=4,
                                  new_run=True) == bucket_keys(4)


def test_a_checkpoint_begun_before_the_keys_were_kept_keeps_its_eight_buckets(
        tmp_path: Path) -> None:
    assert checkpoint_bucket_keys(None, str(tmp_path / "answers"), partitions=2,
                                  new_run=False) == LEGACY_KEYS == tuple(range(8))


def test_no_partitions_is_an_error() -> None:
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        bucket_keys(0)
