"""How an append names itself, so that a replayed micro-batch finds its own commit.

Every append of the answers query carries ``sts-append <app id> <batch id>`` as its
Delta commit's ``userMetadata`` (both writers: Delta on Spark's ``userMetadata``
option, delta-rs's ``CommitProperties(custom_metadata=...)``). A query runs its batches
in order, once each; the only batch that may already be in a table is the first one a
query runs after a restart (Spark runs the last planned batch again), and its commit,
if any, is among the table's latest. Looking it up there is a read of a few commit
files, where Delta's own app transaction lookup replays the table's whole state
(three Spark jobs per append, measured on Delta 4.4).
"""

from __future__ import annotations

_MARKER = "sts-append"
#: Commits of a table's history read for a replayed batch's marker: its commit, if any,
#: is among the latest (between it and a restart the table gets at most a compaction or
#: a backfill merge or two; its one writer is stopped).
HISTORY_LOOKBACK = 100


def append_marker(app_id: str, version: int) -> str:
    """The ``userMetadata`` of an append: which query run and table, which batch.

    Example:
        >>> append_marker("3f2a/answers", 7)
        'sts-append 3f2a/answers 7'
        >>> parse_append_marker(append_marker("3f2a/answers", 7), "3f2a/answers")
        7
        >>> parse_append_marker("sts-append 3f2a/results 7", "3f2a/answers") is None
        True
    """
    return f"{_MARKER} {app_id} {version}"


def parse_append_marker(user_metadata: str | None, app_id: str) -> int | None:
    """The batch an append of ``app_id`` recorded in ``user_metadata`` (``None``: not
    such an append)."""
    parts = (user_metadata or "").split(" ")
    if len(parts) == 3 and parts[0] == _MARKER and parts[1] == app_id and parts[2].isdigit():
        return int(parts[2])
    return None


def last_marked(user_metadata: list[str | None], app_id: str) -> int | None:
    """The highest batch of ``app_id`` among commits' ``user_metadata`` (``None``: none).

    Example:
        >>> last_marked([None, "sts-append a/x 4", "sts-append a/x 5", "x"], "a/x")
        5
    """
    found = [v for m in user_metadata if (v := parse_append_marker(m, app_id)) is not None]
    return max(found) if found else None
