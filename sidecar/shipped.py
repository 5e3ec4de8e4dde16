"""Where the shipped ``conf/`` defaults are: in a source checkout next to the packages,
in an installed wheel under ``<prefix>/share/sts-spark/conf`` (wheel data files)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Where a wheel installs ``conf/`` (``[tool.setuptools.data-files]`` in pyproject.toml).
INSTALLED_CONF = Path("share") / "sts-spark" / "conf"


def conf_dir() -> Path:
    """The shipped ``conf/`` folder: ``$STS_CONF_DIR`` when set, else the checkout's
    ``conf/`` (an editable install), else the installed copy under ``sys.prefix``.

    Example:
        >>> (conf_dir() / "profiles" / "seed-200qps.yaml").is_file()
        True
    """
    if env := os.environ.get("STS_CONF_DIR"):
        return Path(env)
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "conf").is_dir():  # a source checkout
        return root / "conf"
    return Path(sys.prefix) / INSTALLED_CONF
