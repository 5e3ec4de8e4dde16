"""Generate the Python gRPC code for ``proto/sts/v1/inference.proto`` into ``sidecar/pb``.

Run ``python scripts/gen_proto.py`` after editing the .proto. The generated
grpc module imports ``sts.v1.inference_pb2``; the import is rewritten to the
package path ``sidecar.pb.sts.v1`` so no ``sys.path`` trick is needed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
PROTO_FILE = "sts/v1/inference.proto"
OUT = ROOT / "sidecar" / "pb"


def generate(out: Path = OUT) -> list[Path]:
    """Run ``grpc_tools.protoc`` into ``out`` and return the generated files."""
    from grpc_tools import protoc

    pkg = out / "sts" / "v1"
    pkg.mkdir(parents=True, exist_ok=True)
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        PROTO_FILE,
    ])
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    grpc_file = pkg / "inference_pb2_grpc.py"
    text = grpc_file.read_text(encoding="utf-8")
    text = re.sub(r"^from sts\.v1 import", "from sidecar.pb.sts.v1 import", text, flags=re.M)
    grpc_file.write_text(text, encoding="utf-8")
    for init in (out / "__init__.py", out / "sts" / "__init__.py", pkg / "__init__.py"):
        if not init.exists():
            init.write_text('"""Generated from proto/ by scripts/gen_proto.py; do not edit."""\n')
    return sorted(pkg.glob("inference_pb2*"))


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
