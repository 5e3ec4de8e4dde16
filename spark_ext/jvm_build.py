"""Java sources shipped in the package (``spark_ext/jvm/``), compiled into jars with the
JDK's ``javac`` where the session is made: the same source against the same jars gives
the same jar name, so a jar once built is reused.

Used by :mod:`spark_ext.delta_log_store` (Delta's log store for ``file:``) and
:mod:`spark_ext.submit.executor_ready` (the plugin that keeps a new executor off the
stream until its GPU's sidecar serves).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

#: The shipped Java sources.
SOURCES = Path(__file__).with_name("jvm")
#: The Java release the classes are compiled for (Spark 4 runs on 17 and later).
JAVA_RELEASE = "17"
#: A fixed time for the jar's entries, so the same source gives the same jar.
_ZIP_TIME = (2026, 1, 1, 0, 0, 0)


class JvmBuildError(RuntimeError):
    """A shipped Java source could not be compiled (no JDK compiler, or javac failed)."""


def jar_name(prefix: str, source: Path, classpath: Sequence[str]) -> str:
    """``<prefix>-<digest>.jar``: a digest of the source and of the names of the jars it is
    compiled against (a new source or other jars give another jar).

    Example:
        >>> src = SOURCES / "ExecutorReadyPlugin.java"
        >>> jar_name("x", src, ["/a/spark-core_2.13-4.2.0.jar"]).startswith("x-")
        True
        >>> jar_name("x", src, ["/a/y-1.jar"]) == jar_name("x", src, ["/b/y-1.jar"])
        True
    """
    digest = hashlib.sha1(source.read_bytes())
    for jar in sorted(Path(j).name for j in classpath):
        digest.update(jar.encode())
    return f"{prefix}-{digest.hexdigest()[:16]}.jar"


def javac() -> str | None:
    """The JDK's compiler: ``$JAVA_HOME/bin/javac``, else the first on ``PATH``."""
    if home := os.environ.get("JAVA_HOME"):
        candidate = Path(home) / "bin" / "javac"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("javac")


def build_jar(source: Path, classpath: Sequence[str], jar: Path) -> Path:
    """Compile ``source`` against ``classpath`` into ``jar`` unless it is there already.

    Raises:
        JvmBuildError: no ``javac`` (a JRE without a JDK), or it failed.
    """
    if jar.is_file():
        return jar
    compiler = javac()
    if compiler is None:
        raise JvmBuildError("no javac (a JDK's compiler) on PATH or in $JAVA_HOME")
    with tempfile.TemporaryDirectory(prefix="sts-jvm-build-") as tmp:
        classes = Path(tmp) / "classes"
        proc = subprocess.run(
            [compiler, "--release", JAVA_RELEASE, "-nowarn", "-d", str(classes),
             "-cp", os.pathsep.join(classpath), str(source)],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            first = next((line.strip() for line in proc.stderr.splitlines() if line.strip()),
                         f"exit {proc.returncode}")
            raise JvmBuildError(f"javac failed on {source.name}: {first}")
        jar.parent.mkdir(parents=True, exist_ok=True)
        staging = jar.with_suffix(f".{os.getpid()}.tmp")
        _write_jar(classes, staging)
        staging.replace(jar)
    return jar


def _write_jar(classes: Path, jar: Path) -> None:
    """A jar (a zip with a manifest) of the ``.class`` files under ``classes``."""
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo("META-INF/MANIFEST.MF", _ZIP_TIME),
                    "Manifest-Version: 1.0\r\nCreated-By: sts-spark\r\n\r\n")
        for path in sorted(classes.rglob("*.class")):
            info = zipfile.ZipInfo(path.relative_to(classes).as_posix(), _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
