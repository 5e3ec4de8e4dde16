"""A local S3-compatible server for the tests and for ``sts s3-server``: moto's S3
(``moto[server]``, PyPI) in a process of its own (``python -m moto.server``), on a free
loopback port, with one bucket.
Its own process, not a thread of the tests': delta-rs calls that hold the GIL while they
wait on the network would otherwise wait on a server that cannot run (seen: a listing
that timed out after 3 minutes).

Why moto: it installs from PyPI with no binary download, starts in a fraction of a
second, and serves what both clients here need: delta-rs (``deltalake`` 1.x commits
with a conditional ``PUT`` ``If-None-Match: *`` and expects ``412`` when the version
exists; moto honours it) and Hadoop's S3A with the AWS SDK v2 (path-style requests,
multipart uploads, ``ListObjectsV2``, copy, bulk delete). It keeps objects in memory:
everything is gone when the server stops.

    with S3Server() as s3:
        write_deltalake(s3.uri("t"), table, storage_options=s3.storage_options)
        spark = local_session("x", jvm_features=("delta", "s3"))  # with s3.spark_conf()

The same endpoint and credentials come as delta-rs ``storage_options``
(:attr:`S3Server.storage_options`), Spark/Hadoop S3A settings (:meth:`S3Server.spark_conf`)
and the AWS standard environment variables (:attr:`S3Server.environment`).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from typing import Any

#: moto accepts any credentials; these are what the clients are given.
ACCESS_KEY = "sts-test-access-key"
SECRET_KEY = "sts-test-secret-key"
REGION = "us-east-1"
#: Hadoop's S3A file system class; ``fs.s3.impl`` set to it makes ``s3://`` work in Spark.
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"


class S3ServerError(RuntimeError):
    """moto is not installed, or its server did not start. Unrecoverable."""


class S3Server:
    """moto's S3 on 127.0.0.1 with ``bucket`` created, as a context manager.

    Args:
        bucket: The bucket created at start.
        port: The port (default: a free one, chosen by the OS).
    """

    def __init__(self, bucket: str = "sts-test", *, port: int = 0) -> None:
        self.bucket = bucket
        self._port = port
        self._server: Any = None
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self.port is None:
            raise S3ServerError("the S3 server is not started")
        return f"http://127.0.0.1:{self.port}"

    def uri(self, key: str, *, scheme: str = "s3") -> str:
        """``<scheme>://<bucket>/<key>`` (``s3`` for delta-rs, ``s3a`` for Spark)."""
        return f"{scheme}://{self.bucket}/{key.lstrip('/')}"

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs (``deltalake``) ``storage_options`` for this server. ``AWS_ALLOW_HTTP``
        is needed for a plain-HTTP endpoint ("URL scheme is not allowed" without it);
        no locking option is: deltalake 1.x commits with a conditional PUT."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def hadoop_conf(self) -> dict[str, str]:
        """Hadoop S3A settings (without the ``spark.hadoop.`` prefix) for this server,
        for ``s3a://`` and (``fs.s3.impl``) ``s3://``."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.aws.credentials.provider":
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "fs.s3a.access.key": ACCESS_KEY,
            "fs.s3a.secret.key": SECRET_KEY,
            "fs.s3a.impl": S3A_FILESYSTEM,
            "fs.s3.impl": S3A_FILESYSTEM,
        }

    def spark_conf(self) -> dict[str, str]:
        """The S3A settings as Spark settings (``spark.hadoop.fs.s3a.*``). The Spark
        session also needs hadoop-aws (``jvm_features=("s3",)``)."""
        return {f"spark.hadoop.{key}": value for key, value in self.hadoop_conf().items()}

    @property
    def environment(self) -> dict[str, str]:
        """The AWS SDKs' standard variables for this server (boto3, the AWS CLI, and
        delta-rs when it is given no ``storage_options``; ``AWS_ALLOW_HTTP`` is delta-rs's)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self, **kwargs: Any) -> Any:
        """A boto3 S3 client on this server (``kwargs`` go to ``boto3.client``, e.g. a
        botocore ``config``)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION, **kwargs)

    def keys(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` in the bucket, sorted."""
        paginator = self.client().get_paginator("list_objects_v2")
        return sorted(obj["Key"] for page in paginator.paginate(Bucket=self.bucket,
                                                                 Prefix=prefix)
                      for obj in page.get("Contents", []))

    def start(self, timeout_s: float = 60.0) -> "S3Server":
        """Start the server and create the bucket.

        Raises:
            S3ServerError: moto (``moto[server]``) is missing or its server did not start.
        """
        import importlib.util

        from sts_harness.process import free_port

        if importlib.util.find_spec("moto") is None:
            raise S3ServerError("the S3 test server needs moto[server] "
                                "(pip install 'moto[server]')")
        self.port = self._port or free_port()
        # The server logs a line per request to stderr: into a file, never a pipe nobody
        # reads (a full pipe blocks moto's request threads, and with them every S3 call).
        self._log = tempfile.TemporaryFile()
        self._server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=self._log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._server.poll() is not None:
                self._log.seek(0)
                err = self._log.read().decode(errors="replace").strip()
                self._server = None
                raise S3ServerError(f"the S3 test server (moto) exited: {err[-300:]}")
            try:
                self.client().create_bucket(Bucket=self.bucket)
                return self
            except Exception as e:  # noqa: BLE001 - not serving yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise S3ServerError(f"the S3 test server (moto) did not start: {e}") from e
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server (its objects are gone). Idempotent."""
        if self._server is not None:
            try:
                self._server.terminate()
                try:
                    self._server.wait(10)
                except subprocess.TimeoutExpired:
                    self._server.kill()
                    self._server.wait()
            finally:
                self._server = None
                self._log.close()

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def settings_text(server: S3Server, prefix: str = "sts") -> str:
    """What a user needs to point the pipeline at ``server``: the AWS variables, the
    ``output`` section for each writer (tables on ``s3://``, checkpoints on ``s3a://``)
    and the Spark settings for ``spark-submit`` and for ``sts connect-server``.

    Example:
        >>> s = S3Server("b"); s.port = 9000
        >>> text = settings_text(s, "demo")
        >>> "out_dir: s3://b/demo/tables" in text, "checkpoint_dir: s3a://b/demo/checkpoints" in text
        (True, True)
    """
    import json

    env = "\n".join(f"  export {k}={v}" for k, v in server.environment.items())
    confs = " ".join(f"--conf {k}={v}" for k, v in server.spark_conf().items())
    tables = server.uri(f"{prefix}/tables", scheme="s3")
    checkpoints = server.uri(f"{prefix}/checkpoints", scheme="s3a")
    return (
        f"The AWS variables (boto3, the AWS CLI, delta-rs):\n{env}\n\n"
        "The pipeline's output, Delta on Spark (writer: spark; also on Spark Connect):\n"
        f"  output:\n    writer: spark\n    out_dir: {tables}\n"
        f"    checkpoint_dir: {checkpoints}\n"
        "  with hadoop-aws and these settings in the session:\n"
        "  spark-submit --packages \"$(python -m spark_ext.jvm_packages --with s3)\" "
        f"{confs} spark_ext/pipeline/job.py --config <your config>\n"
        f"  sts connect-server --with-s3 {confs}\n\n"
        "The pipeline's output, delta-rs from the driver (writer: deltalake):\n"
        f"  output:\n    writer: deltalake\n    out_dir: {tables}\n"
        f"    checkpoint_dir: {checkpoints}\n"
        f"    storage_options: {json.dumps(server.storage_options)}\n"
        "  (the checkpoints are Spark's: the session needs hadoop-aws and the settings above)")
