"""One sidecar per GPU, found from the task's GPU and started by the first task that needs it.

Spark assigns GPUs to tasks (``spark.task.resource.gpu.amount``); a task's sidecar is
``gpu_endpoint.format(gpu=N)`` for its first GPU address ``N``, else ``endpoint``
(:func:`endpoint_for`). Who starts the sidecars is ``SidecarEndpointConfig.launch``:

* ``none``: the cluster does (``conf/cluster/``: a Databricks init script, a
  Spark-on-Kubernetes pod template), or you; tasks only connect.
* ``lazy``: :func:`ensure_sidecar` in the task. If the sidecar does not serve, the
  task takes an exclusive ``flock`` on ``run_dir/sts-gpu{N}.lock`` (concurrent tasks
  on the GPU wait on it), looks again, and if it is still not serving and no sidecar
  it started earlier is alive (``sts-gpu{N}.pid``), starts
  ``python -m sidecar.cli sidecar --listen <endpoint> --results-dir <results_dir>
  --sidecar-id <host>-gpu{N} <launch_args>`` in its own session (it outlives the
  Python worker and the executor, so the next executor on the GPU reuses it), with
  ``CUDA_VISIBLE_DEVICES=N`` and its output in ``sts-gpu{N}.log``; it waits until the
  sidecar serves (``start_timeout_s``; a task of the running stream only
  ``submission.STREAM_START_WAIT_S``, so a GPU executor that joins later never holds up a
  micro-batch for its sidecar's warm-up) and releases the lock. Later tasks find it
  serving and only connect; one that finds it exited before ever serving (its log has
  no ``sts sidecar ready`` line since its start) raises its log's last line. With
  ``orphan_exit_s`` the sidecar follows its executor: each Python worker names its
  executor's JVM in ``sts-gpu{N}.owner`` (unless another running one is named), and
  once no running executor has been named there for ``orphan_exit_s`` the sidecar
  drains and exits (:mod:`sidecar.owner_watch`), which frees the GPU after a scale-in;
  a task that finds it draining waits for it to exit and starts a new one.

Every sidecar writes its result files into the same ``results_dir``: their names
carry the sidecar id (``part-{incarnation}-{seq}-{sidecar_id}.parquet``), so writers
never collide and the results stream reads them all. :func:`stop_sidecars` stops the
sidecars started into a ``run_dir``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sidecar import claim_owner, write_text_atomically
from spark_ext.config import SidecarEndpointConfig
from spark_ext.exceptions import SidecarLaunchError

logger = logging.getLogger(__name__)

#: Longest unix socket path Linux accepts (``sun_path`` is 108 bytes with its NUL).
_MAX_SOCKET_PATH = 107
#: Sidecars this Python process started, by pid (their exit is seen and reaped through
#: these; ``/proc`` may still show the pre-exec command line just after the start).
_STARTED: dict[int, subprocess.Popen[bytes]] = {}
#: Owner files this Python process has written its executor into (once each).
_CLAIMED: set[str] = set()


def task_gpu() -> str | None:
    """The first GPU address Spark assigned the running task, or ``None`` (no task,
    no GPU resource)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    gpus = ctx.resources().get("gpu") if ctx is not None else None
    return gpus.addresses[0] if gpus is not None and gpus.addresses else None


def endpoint_for(config: SidecarEndpointConfig, gpu: str | None) -> str:
    """The sidecar of GPU ``gpu``: ``gpu_endpoint`` filled in, else ``endpoint``.

    Example:
        >>> cfg = SidecarEndpointConfig(gpu_endpoint="unix:///run/sts/sts-gpu{gpu}.sock")
        >>> endpoint_for(cfg, "1"), endpoint_for(cfg, None)
        ('unix:///run/sts/sts-gpu1.sock', '127.0.0.1:50051')
    """
    if config.gpu_endpoint and gpu is not None:
        return config.gpu_endpoint.format(gpu=gpu)
    return config.endpoint


def sidecar_name(gpu: str | None) -> str:
    """The stem of a GPU's lock, pid and log files in ``run_dir``.

    Example:
        >>> sidecar_name("0"), sidecar_name(None)
        ('sts-gpu0', 'sts-default')
    """
    return f"sts-gpu{gpu}" if gpu is not None else "sts-default"


def for_tasks(config: SidecarEndpointConfig) -> SidecarEndpointConfig:
    """``config`` as shipped to tasks: with ``launch: lazy``, ``results_dir`` and
    ``run_dir`` made absolute here, on the driver, so a relative folder means the
    same one to the sidecars the tasks start as to the results stream (a task's
    working folder is the executor's).

    Example:
        >>> import os
        >>> cfg = for_tasks(SidecarEndpointConfig(launch="lazy", results_dir="res"))
        >>> cfg.results_dir == os.path.join(os.getcwd(), "res")
        True
    """
    if config.launch != "lazy":
        return config
    return dataclasses.replace(config, results_dir=str(Path(config.results_dir).absolute()),
                               run_dir=str(Path(config.run_dir).absolute()))


def task_sidecar(config: SidecarEndpointConfig, *, wait_s: float | None = None
                 ) -> tuple[str, bool]:
    """The endpoint of the running task's sidecar, started first with ``launch: lazy``,
    and whether it serves (``True`` without ``launch: lazy``: the cluster runs it).

    Args:
        wait_s: How long to wait for a sidecar found starting or started here
            (default ``start_timeout_s``); it goes on starting in the background.

    Raises:
        SidecarLaunchError: a sidecar this task started, or the last one started for its
            GPU, exited before serving.
    """
    gpu = task_gpu() if config.gpu_endpoint else None
    endpoint = endpoint_for(config, gpu)
    if config.launch == "lazy":
        return endpoint, ensure_sidecar(config, gpu, endpoint, wait_s=wait_s)
    return endpoint, True


def _serving(config: SidecarEndpointConfig, endpoint: str) -> bool:
    from sidecar.client import SidecarClient

    with SidecarClient(endpoint, timeout_s=2.0, security=config.security()) as client:
        return client.is_serving()


def ensure_sidecar(config: SidecarEndpointConfig, gpu: str | None, endpoint: str, *,
                   wait_s: float | None = None) -> bool:
    """Make sure GPU ``gpu``'s sidecar at ``endpoint`` serves, starting it if needed;
    at most one is started per GPU however many tasks call this at once.

    Args:
        wait_s: How long to wait for it to serve (default ``start_timeout_s``). A sidecar
            still starting then goes on in the background (its own session); a later
            call finds it serving, or finds it exited before serving and raises.

    Returns:
        True when it serves; False when it did not within ``wait_s`` (the caller's
        requests then get ``unavailable`` and the fallback).

    Raises:
        SidecarLaunchError: the sidecar started here, or the last one started for this
            GPU, exited before serving (its log says why: bad ``launch_args``, the
            endpoint taken, ...), or its socket path is too long for a unix socket.
    """
    sock = endpoint.removeprefix("unix://") if endpoint.startswith("unix://") else ""
    if len(os.fsencode(sock)) > _MAX_SOCKET_PATH:
        raise SidecarLaunchError(f"socket path {sock} is longer than {_MAX_SOCKET_PATH} "
                                 "bytes (the unix socket limit); use a shorter folder")
    run_dir = Path(config.run_dir)
    name = sidecar_name(gpu)
    if config.orphan_exit_s is not None:
        _claim(run_dir / f"{name}.owner")
    if _serving(config, endpoint):
        return True
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    deadline = time.monotonic() + (config.start_timeout_s if wait_s is None else wait_s)
    with open(run_dir / f"{name}.lock", "a+b") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # another task on this GPU is starting it
                if time.monotonic() > deadline:
                    return _serving(config, endpoint)
                time.sleep(0.1)
        try:
            if _serving(config, endpoint):
                return True
            log = run_dir / f"{name}.log"
            pid = _live_pid(run_dir / f"{name}.pid")
            if pid is None and (why := _failed_start(run_dir / name)) is not None:
                raise SidecarLaunchError(f"the sidecar last started for {endpoint} exited "
                                         f"before serving; log {log}: {why}")
            if pid is not None:  # running, not serving: starting, or draining to exit
                serving = _wait_serving(config, endpoint, pid, log, deadline, exit_ok=True,
                                        warn=wait_s is None)
                if serving is not None:
                    return serving
            pid = _start(config, gpu, endpoint, run_dir / name)
            return _wait_serving(config, endpoint, pid, log, deadline,
                                 warn=wait_s is None) is True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _start(config: SidecarEndpointConfig, gpu: str | None, endpoint: str, stem: Path) -> int:
    """Start the sidecar detached; record its pid in ``stem.pid``."""
    if endpoint.startswith("unix://"):
        sock = Path(endpoint.removeprefix("unix://"))
        sock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        sock.unlink(missing_ok=True)  # a socket left by a sidecar that died
    sidecar_id = f"{socket.gethostname()}-{stem.name.removeprefix('sts-')}"
    cmd = [sys.executable, "-m", "sidecar.cli", "sidecar", "--listen", endpoint,
           "--results-dir", str(Path(config.results_dir).absolute()),
           "--sidecar-id", sidecar_id, *config.launch_args]
    if config.orphan_exit_s is not None and executor_pid() is not None:
        # Only with an owner to follow: a sidecar whose owner file nobody writes would
        # drain and exit orphan_exit_s after every start.
        cmd += ["--set", f"server.owner.file={stem.with_suffix('.owner').absolute()}",
                "--set", f"server.owner.exit_after_s={config.orphan_exit_s:g}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    log_file = stem.with_suffix(".log")
    write_text_atomically(stem.with_suffix(".start"),
                          str(log_file.stat().st_size if log_file.exists() else 0))
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=stem.parent,
                                start_new_session=True, umask=0o007)
    _STARTED[proc.pid] = proc
    write_text_atomically(stem.with_suffix(".pid"), f"{proc.pid}\n")
    logger.warning("Started sidecar %s for GPU %s on %s (pid %d, log %s).", sidecar_id, gpu,
                   endpoint, proc.pid, stem.with_suffix(".log"))
    return proc.pid


#: What a sidecar prints once it serves (``sidecar.server``).
READY_LINE = b"sts sidecar ready on "


def _failed_start(stem: Path) -> str | None:
    """The last line of the log of the sidecar last started as ``stem`` when it exited
    without ever serving (``None`` when it served, or none was started here)."""
    try:
        offset = int(stem.with_suffix(".start").read_text())
        with open(stem.with_suffix(".log"), "rb") as log:
            log.seek(offset)
            text = log.read()
    except (OSError, ValueError):
        return None
    if READY_LINE in text:
        return None
    lines = text.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(empty log)"


def _claim(owner_file: Path) -> None:
    """Name this task's executor the owner of the GPU's sidecar (once per Python worker),
    unless another running executor is named: the sidecar drains and exits once its
    owner is gone for ``orphan_exit_s`` (:mod:`sidecar.owner_watch`)."""
    key = str(owner_file)
    if key in _CLAIMED:
        return
    executor = executor_pid()
    if executor is None:  # not under a JVM (a plain Python process): nothing to follow
        _CLAIMED.add(key)
        return
    owner_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if claim_owner(owner_file, executor):
        _CLAIMED.add(key)


def executor_pid() -> int | None:
    """The pid of the JVM this Python process runs under (the executor, or the driver in
    local mode): the nearest ancestor named ``java``; ``None`` when there is none.

    Example:
        >>> executor_pid() is None or executor_pid() > 1
        True
    """
    pid = os.getppid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name == "java":
            return pid
        pid = int(rest.split()[1])
    return None


def executor_name() -> str:
    """This task's executor as ``host:pid`` of its JVM (``host:?`` outside a JVM): what
    tells a new executor from one that was there (:mod:`spark_ext.pipeline.executor_warmup`)."""
    return f"{socket.gethostname()}:{executor_pid() or '?'}"


def _wait_serving(config: SidecarEndpointConfig, endpoint: str, pid: int, log: Path,
                  deadline: float, *, exit_ok: bool = False, warn: bool = True
                  ) -> bool | None:
    """Until sidecar ``pid`` serves (``True``) or ``deadline`` passes (whether it serves
    then; a warning with ``warn``, else it is still starting, as the caller allowed). If
    it exits first: ``None`` with ``exit_ok`` (one found running, which drained and
    exited because its executor is gone), else :class:`SidecarLaunchError`."""
    while time.monotonic() < deadline:
        if _serving(config, endpoint):
            return True
        if not _alive(pid):
            if exit_ok:
                return None
            tail = _last_line(log)
            raise SidecarLaunchError(f"sidecar for {endpoint} (pid {pid}) exited before "
                                     f"serving; log {log}: {tail}")
        time.sleep(0.2)
    if warn:
        logger.warning("Sidecar for %s (pid %d) not serving after the start timeout; "
                       "see %s.", endpoint, pid, log)
    else:
        logger.info("Sidecar for %s (pid %d) still starting; this task's requests get the "
                    "fallback (log %s).", endpoint, pid, log)
    return _serving(config, endpoint)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs a sidecar (not a zombie, not a reused pid)."""
    if (proc := _STARTED.get(pid)) is not None:
        return proc.poll() is None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return b"sidecar.cli" in cmdline and state not in ("Z", "X")


def _live_pid(pid_file: Path) -> int | None:
    """The pid recorded in ``pid_file`` if that sidecar still runs."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _last_line(path: Path) -> str:
    try:
        lines = path.read_bytes()[-4000:].decode(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


def stop_sidecars(run_dir: str | os.PathLike[str], timeout_s: float = 10.0) -> list[int]:
    """Stop (SIGTERM, then SIGKILL after ``timeout_s``) the sidecars whose pid files
    are in ``run_dir``; returns their pids. The sidecars drain as on any SIGTERM.

    Example:
        >>> import tempfile
        >>> stop_sidecars(tempfile.mkdtemp())
        []
    """
    pids = [pid for f in sorted(Path(run_dir).glob("sts-*.pid"))
            if (pid := _live_pid(f)) is not None]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            if (proc := _STARTED.get(pid)) is not None:
                proc.wait()
    return pids
