"""Public names of a package, loaded on first use (PEP 562 module ``__getattr__``), so
importing one module of a package does not import every module its API names: a Spark
Python worker that runs the submission never loads the Delta writer, and ``sts --help``
never loads Spark. Used by ``spark_ext`` and ``sts_harness`` (it lives in the bottom
package so that neither needs the other to import it)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], renamed: Mapping[str, str] = {}
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each public name
    to the module it comes from, ``renamed`` a public name to its name in that module.

    Example:
        >>> getattr_, dir_ = lazy_exports("pkg", {"sqrt": "math"})
        >>> getattr_("sqrt")(9.0), "sqrt" in dir_()
        (3.0, True)
    """
    module = sys.modules.get(package)  # the package itself, while its __init__ runs
    module_globals = module.__dict__ if module is not None else {}

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), renamed.get(name, name))
        module_globals[name] = value  # the next access is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*module_globals, *exports})

    return __getattr__, __dir__
