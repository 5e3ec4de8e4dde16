"""Keep PySpark's per-task garbage collection cheap in long-lived Python workers.

PySpark's worker daemon calls ``gc.collect()`` after every task of a reused Python
worker (``spark.python.worker.reuse``, the default). A full collection walks every
tracked object of the process: a few milliseconds in a bare worker, ~0.3 s once torch,
transformers and a MiniLM model are loaded, and the L1/L2 workers run a task or two
per micro-batch. On a node where Spark has one core next to the engine that is CPU
taken from the micro-batches (measured: most of the Python workers' CPU in the
default ``sts demo``).

:func:`freeze_loaded` moves what a worker has loaded (modules, models, readers) into
the collector's permanent generation after a full collection, once per thing loaded,
so later collections only walk what the tasks create. It is meant for objects that live
as long as the process: frozen objects are never collected as cycles.
"""

from __future__ import annotations

import gc
import os

_frozen: set[tuple[int, str]] = set()


def freeze_loaded(what: str) -> bool:
    """Collect once, then freeze every object this process holds, once per process and
    ``what`` (what was just loaded: ``"fast_path"``, ``"submit"``, ...), so a worker
    that froze after its first light task freezes again when it loads a model.

    Call it in a Spark task right after loading what the worker's tasks reuse. Outside
    a task (a driver, a notebook kernel, a test) it does nothing: frozen objects are
    never collected as cycles (reference counting still frees them).

    Returns:
        ``True`` when this call froze; ``False`` when this process had already for
        ``what``, or when it is not running a Spark task.
    """
    from pyspark import TaskContext

    key = (os.getpid(), what)  # a forked child froze nothing of its own yet
    if key in _frozen or TaskContext.get() is None:
        return False
    gc.collect()
    gc.freeze()
    _frozen.add(key)
    return True
