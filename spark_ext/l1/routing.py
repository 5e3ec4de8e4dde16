"""L1: a small classifier on sentence embeddings decides ``priority`` and ``route``.

Trained by ``sts l1 train`` from labelled JSON lines (``text``, ``priority`` =
``high``/``normal``/``low``, ``route`` = ``llm``/``rule``/``drop``): one multinomial
logistic regression per label on the embeddings, scored on a held-out share. The
model file is JSON (labels, weights, the embedding model's dimension and name): small,
readable, and applied with numpy alone, so executors need no scikit-learn.

In Spark, :func:`route_events` adds ``priority`` and ``route`` from the model, then
applies the SQL rules of :class:`~spark_ext.config.RoutingConfig` (first match wins).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from sidecar import write_text_atomically
from sidecar.contract import PRIORITY_NAMES
from spark_ext.config import ROUTES, EmbeddingConfig, RoutingConfig
from spark_ext.exceptions import RoutingModelError
from spark_ext.sources.jsonl_input import non_empty_string, one_of, read_jsonl

if TYPE_CHECKING:
    import numpy as np
    from pyspark.sql import Column, DataFrame

logger = logging.getLogger(__name__)

#: ``format`` of the model file.
MODEL_FORMAT = "sts-l1-router/1"
#: The labels the classifier predicts, with their classes.
HEADS: dict[str, tuple[str, ...]] = {"priority": PRIORITY_NAMES, "route": ROUTES}


@dataclass(frozen=True)
class Head:
    """One label's linear model: ``argmax(x @ coef.T + intercept)``."""

    labels: tuple[str, ...]
    coef: "np.ndarray"
    intercept: "np.ndarray"

    def predict(self, x: "np.ndarray") -> tuple[list[str], "np.ndarray"]:
        """Labels and their probabilities for the rows of ``x``."""
        import numpy as np

        logits = x @ self.coef.T + self.intercept
        if len(self.labels) == 2 and logits.shape[1] == 1:  # binary: one column
            logits = np.hstack([-logits / 2, logits / 2])
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        best = p.argmax(axis=1)
        return [self.labels[i] for i in best], p[np.arange(len(best)), best]


@dataclass(frozen=True)
class RouterModel:
    """The trained L1 classifier (see the module docstring)."""

    heads: dict[str, Head]
    dim: int
    embedding_model: str
    metrics: dict[str, Any]

    def predict(self, x: "np.ndarray") -> dict[str, tuple[list[str], "np.ndarray"]]:
        """Per head: labels and confidences for the embeddings ``x``.

        Raises:
            RoutingModelError: ``x`` has another dimension than the training embeddings.
        """
        if x.ndim != 2 or (len(x) and x.shape[1] != self.dim):
            raise RoutingModelError(
                f"embeddings of shape {x.shape} do not fit the L1 model ({self.dim}-d, trained "
                f"with {self.embedding_model}): retrain it with `sts l1 train`")
        return {name: head.predict(x) for name, head in self.heads.items()}

    def to_json(self) -> str:
        return json.dumps({
            "format": MODEL_FORMAT, "dim": self.dim, "embedding_model": self.embedding_model,
            "metrics": self.metrics,
            "heads": {name: {"labels": list(h.labels), "coef": h.coef.round(7).tolist(),
                             "intercept": h.intercept.round(7).tolist()}
                      for name, h in self.heads.items()},
        })

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "RouterModel":
        """Read a model file.

        Raises:
            RoutingModelError: Missing, not a model file, or malformed.
        """
        import numpy as np

        p = Path(path)
        if not p.is_file():
            raise RoutingModelError(f"no L1 model at {p}: train one with `sts l1 train`")
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            if data.get("format") != MODEL_FORMAT:
                raise RoutingModelError(f"{p} is not an L1 model file ({MODEL_FORMAT})")
            dim = int(data["dim"])
            heads = {}
            for name, h in data["heads"].items():
                coef = np.asarray(h["coef"], dtype=np.float32)
                intercept = np.asarray(h["intercept"], dtype=np.float32)
                if coef.ndim != 2 or coef.shape[1] != dim or len(intercept) != len(coef):
                    raise ValueError(f"head {name} has weights of shape {coef.shape}")
                heads[name] = Head(tuple(h["labels"]), coef, intercept)
            if set(heads) != set(HEADS):
                raise ValueError(f"heads {sorted(heads)}, expected {sorted(HEADS)}")
        except (ValueError, KeyError, TypeError) as e:
            raise RoutingModelError(f"{p}: malformed L1 model file: {e}") from e
        return cls(heads, dim, str(data.get("embedding_model", "")), dict(data.get("metrics", {})))


def read_labelled(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Labelled examples (``text``, ``priority``, ``route``), checked line by line.

    Raises:
        InputFileError: Missing or empty file, or bad lines (with their numbers).
    """
    return read_jsonl(path, required={"text": non_empty_string,
                                      "priority": one_of(*PRIORITY_NAMES),
                                      "route": one_of(*ROUTES)}, what="labelled examples")


def _logistic() -> Any:
    from sklearn.linear_model import LogisticRegression

    # balanced: rare labels (high, drop) count as much as common ones
    return LogisticRegression(max_iter=3000, C=10.0, class_weight="balanced")


def train_router(input_path: str | os.PathLike[str], out_path: str | os.PathLike[str],
                 embedding: EmbeddingConfig, *, holdout: float = 0.25, seed: int = 0
                 ) -> RouterModel:
    """Train both heads on ``input_path``, score them on a held-out share, write the
    model file to ``out_path`` (atomically) and return it.

    The held-out split (fixed by ``seed``) keeps texts that differ only in their numbers
    together; the final model is refitted on all examples. ``metrics`` holds the
    held-out accuracy per head.

    Raises:
        InputFileError: Bad input (see :func:`read_labelled`), or a label with fewer
            than two examples.
    """
    import numpy as np
    from sklearn.model_selection import GroupShuffleSplit

    from spark_ext.l1.embedding import embed_texts, model_path
    from spark_ext.exceptions import InputFileError

    if not 0 < holdout < 1:
        raise ValueError(f"{holdout=} must be in (0, 1)")
    start = time.monotonic()
    rows = read_labelled(input_path)
    for name in HEADS:
        counts = {label: sum(r[name] == label for r in rows) for label in {r[name] for r in rows}}
        if len(counts) < 2 or min(counts.values()) < 2:
            raise InputFileError(f"{input_path}: {name} needs at least two labels with two "
                                 f"examples each, got {counts}")
    x = embed_texts([r["text"] for r in rows], embedding)
    labels = {name: np.asarray([r[name] for r in rows]) for name in HEADS}
    # Near-duplicates (the same text with other numbers) stay on one side of the split,
    # so the held-out score is not a memory test.
    groups = np.asarray([_NUMBERS.sub("#", r["text"].lower()) for r in rows])
    train, test = next(GroupShuffleSplit(n_splits=1, test_size=holdout, random_state=seed)
                       .split(groups, groups=groups))
    metrics: dict[str, Any] = {"examples": len(rows), "train": len(train), "held_out": len(test)}
    heads = {}
    for name, y in labels.items():
        probe = _logistic().fit(x[train], y[train])
        metrics[f"{name}_accuracy"] = round(float((probe.predict(x[test]) == y[test]).mean()), 4)
        final = _logistic().fit(x, y)
        heads[name] = Head(tuple(str(c) for c in final.classes_),
                           final.coef_.astype(np.float32), final.intercept_.astype(np.float32))
    metrics["seconds"] = round(time.monotonic() - start, 2)
    model = RouterModel(heads, int(x.shape[1]), model_path(embedding).name, metrics)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out, model.to_json())
    return model


_NUMBERS = re.compile(r"\d+")

_MODELS: dict[tuple[str, int], RouterModel] = {}
_LOCK = threading.Lock()


def cached_model(path: str) -> RouterModel:
    """The model file at ``path``, read once per process (again when it changes)."""
    key = (path, os.stat(path).st_mtime_ns)
    with _LOCK:
        if key not in _MODELS:
            _MODELS[key] = RouterModel.load(path)
        return _MODELS[key]


def classify_udf(model_file: str) -> Any:
    """A pandas UDF ``embedding -> struct<priority, route, priority_confidence,
    route_confidence>``; the model file is read once per Python worker."""
    import numpy as np
    from pyspark.sql import functions as F

    path = str(Path(model_file).resolve())
    RouterModel.load(path)  # fail on the driver, not in a task

    @F.pandas_udf("priority string, route string, priority_confidence float, "  # type: ignore
                  "route_confidence float")
    def classify(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        model = cached_model(path)
        for vectors in batches:
            x = np.stack(vectors.to_numpy()).astype(np.float32) if len(vectors) else \
                np.zeros((0, model.dim), dtype=np.float32)
            out = model.predict(x)
            yield pd.DataFrame({
                "priority": out["priority"][0], "route": out["route"][0],
                "priority_confidence": out["priority"][1].astype(np.float32),
                "route_confidence": out["route"][1].astype(np.float32)})

    return classify


def route_events(df: "DataFrame", config: RoutingConfig, embedding: EmbeddingConfig, *,
                 embedding_column: str = "embedding", priority_column: str = "priority"
                 ) -> "DataFrame":
    """``df`` with ``priority`` and ``route`` set by the model and then the rules.

    ``embedding_column`` is added (from ``config.text_column``) when missing, so L2 can
    reuse it. Without a model file, ``route`` is ``llm`` and ``priority`` stays the
    value of ``priority_column``. Rules override them: the first rule whose ``when``
    holds decides, and what it does not set keeps the model's value.
    ``priority_confidence`` and ``route_confidence`` are the model's (null without one).

    Usage::

        routed = route_events(events, RoutingConfig(model_file="l1.json"), EmbeddingConfig())
        to_llm = routed.where("route = 'llm'")
    """
    from pyspark.sql import functions as F

    from spark_ext.l1.embedding import embed_column

    if config.text_column not in df.columns:
        raise ValueError(f"routing.text_column={config.text_column!r} is not a column of "
                         f"the events ({df.columns})")
    out = df
    if config.model_file:
        if embedding_column not in out.columns:
            out = out.withColumn(embedding_column, embed_column(config.text_column, embedding))
        cls = classify_udf(config.model_file)(F.col(embedding_column))
        out = (out.withColumn("_l1", cls)
                  .withColumn("priority", F.col("_l1.priority"))
                  .withColumn("route", F.col("_l1.route"))
                  .withColumn("priority_confidence", F.col("_l1.priority_confidence"))
                  .withColumn("route_confidence", F.col("_l1.route_confidence"))
                  .drop("_l1"))
    else:
        base = F.col(priority_column) if priority_column in out.columns else F.lit("normal")
        out = (out.withColumn("priority", base.cast("string"))
                  .withColumn("route", F.lit("llm"))
                  .withColumn("priority_confidence", F.lit(None).cast("float"))
                  .withColumn("route_confidence", F.lit(None).cast("float")))
    return apply_rules(out, config)


def apply_rules(df: "DataFrame", config: RoutingConfig) -> "DataFrame":
    """``df`` (with ``route`` and ``priority``) after the rules of ``config``: the first
    rule whose ``when`` holds decides; what it does not set keeps the current value."""
    from pyspark.sql import functions as F

    model_route, model_priority = F.col("route"), F.col("priority")
    route, priority = model_route, model_priority
    for rule in reversed(config.rules):  # built from the last, so the first match wins
        cond = F.coalesce(F.expr(rule["when"]).cast("boolean"), F.lit(False))
        route = F.when(cond, F.lit(rule["route"]) if "route" in rule else model_route
                       ).otherwise(route)
        priority = F.when(cond, F.lit(rule["priority"]) if "priority" in rule
                          else model_priority).otherwise(priority)
    return df.withColumn("route", route).withColumn("priority", priority)
