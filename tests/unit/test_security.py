"""Transport security of the whole sidecar (``serve`` in process, real sockets, the real
``SidecarClient``): TLS, mutual TLS, the bearer token, bind checks and socket permissions."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from sidecar import ClientSecurity
from sidecar.client import SidecarClient
from sidecar.config import ServerConfig, SidecarConfig
from sidecar.exceptions import ConfigError
from sidecar.security import check_listen
from sidecar.server import serve
from tests.certs import TlsFiles, make_tls_files
from tests.utils import free_port

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("rogue"), prefix="rogue-")


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def _config(tmp_path: Path, listen: str, **server: object) -> SidecarConfig:
    return SidecarConfig.from_dict({
        "server": {"listen": listen, "sidecar_id": "sec", **server},
        "engine": {"kind": "simulated"},
        "results": {"results_dir": str(tmp_path / "results")},
    })


def _with_sidecar(config: SidecarConfig,
                  body: Callable[[], Awaitable[None]]) -> None:
    """Run ``serve(config)`` while ``body`` runs (blocking clients go through threads)."""
    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, stop=stop))
        try:
            await asyncio.sleep(0)
            await body()
        finally:
            stop.set()
            await task

    asyncio.run(main())


async def _stats(target: str, security: ClientSecurity | None) -> grpc.StatusCode | str:
    """GetStats through the real blocking client: the engine kind, or the error code."""
    def call() -> grpc.StatusCode | str:
        with SidecarClient(target, timeout_s=5, security=security) as client:
            try:
                return client.stats().engine
            except grpc.RpcError as e:
                return e.code()
    return await asyncio.to_thread(call)


async def _wait_serving(target: str, security: ClientSecurity | None = None) -> None:
    def call() -> None:
        with SidecarClient(target, security=security) as client:
            client.wait_until_serving(20)
    await asyncio.to_thread(call)


def test_tls_and_token_accept_the_right_client_and_refuse_the_others(
        tmp_path: Path, tls: TlsFiles, rogue: TlsFiles, token_file: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    config = _config(tmp_path, target, tls_cert_file=str(tls.server_cert),
                     tls_key_file=str(tls.server_key), token_file=str(token_file))
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token")
    monkeypatch.setenv("STS_TEST_TOKEN", TOKEN)
    good = ClientSecurity(tls_ca_file=str(tls.ca), token_file=str(token_file))
    seen: dict[str, object] = {}

    async def body() -> None:
        await _wait_serving(target, ClientSecurity(tls_ca_file=str(tls.ca)))  # health: no token
        seen["good"] = await _stats(target, good)
        seen["env token"] = await _stats(target, ClientSecurity(tls_ca_file=str(tls.ca),
                                                                 token_env="STS_TEST_TOKEN"))
        seen["wrong token"] = await _stats(target, ClientSecurity(tls_ca_file=str(tls.ca),
                                                                   token_file=str(wrong)))
        seen["no token"] = await _stats(target, ClientSecurity(tls_ca_file=str(tls.ca)))
        seen["plaintext"] = await _stats(target, ClientSecurity(token_file=str(token_file)))
        seen["other CA"] = await _stats(target, ClientSecurity(tls_ca_file=str(rogue.ca),
                                                                token_file=str(token_file)))

    _with_sidecar(config, body)
    assert seen == {
        "good": "simulated", "env token": "simulated",
        "wrong token": grpc.StatusCode.UNAUTHENTICATED,
        "no token": grpc.StatusCode.UNAUTHENTICATED,
        "plaintext": grpc.StatusCode.UNAVAILABLE,
        "other CA": grpc.StatusCode.UNAVAILABLE,
    }


def test_mutual_tls_needs_a_client_certificate(tmp_path: Path, tls: TlsFiles,
                                                rogue: TlsFiles) -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    config = _config(tmp_path, target, tls_cert_file=str(tls.server_cert),
                     tls_key_file=str(tls.server_key), tls_client_ca_file=str(tls.ca))
    seen: dict[str, object] = {}

    async def body() -> None:
        with_cert = ClientSecurity(tls_ca_file=str(tls.ca), tls_cert_file=str(tls.client_cert),
                                   tls_key_file=str(tls.client_key))
        await _wait_serving(target, with_cert)
        seen["client cert"] = await _stats(target, with_cert)
        seen["no client cert"] = await _stats(target, ClientSecurity(tls_ca_file=str(tls.ca)))
        seen["cert of another CA"] = await _stats(target, ClientSecurity(
            tls_ca_file=str(tls.ca), tls_cert_file=str(rogue.client_cert),
            tls_key_file=str(rogue.client_key)))

    _with_sidecar(config, body)
    assert seen["client cert"] == "simulated"
    assert seen["no client cert"] == grpc.StatusCode.UNAVAILABLE
    assert seen["cert of another CA"] == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", "10.1.2.3:50051",
                                    "sidecar.example:50051"])
def test_a_remote_address_without_tls_or_token_is_refused(tmp_path: Path, listen: str) -> None:
    with pytest.raises(ConfigError, match=r"refusing to listen on .* without TLS or a token"):
        asyncio.run(serve(_config(tmp_path, listen)))
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
    # A token, TLS, or the lab switch lets the same address through the check.
    check_listen(ServerConfig(listen=listen), token="t")
    check_listen(ServerConfig(listen=listen, tls_cert_file="c.pem", tls_key_file="k.pem"),
                 token=None)
    check_listen(ServerConfig(listen=listen, allow_insecure_remote=True), token=None)


def test_unix_socket_is_0660_in_a_directory_the_sidecar_owns(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "sts" / "sts-gpu0.sock"
    target = f"unix://{sock}"
    config = _config(tmp_path, target)
    seen: dict[str, object] = {}

    async def body() -> None:
        await _wait_serving(target)
        seen["mode"] = stat.S_IMODE(sock.stat().st_mode)
        seen["dir mode"] = stat.S_IMODE(sock.parent.stat().st_mode)
        seen["stats"] = await _stats(target, None)

    old = os.umask(0)  # the case: umask 000 used to give srwxrwxrwx
    try:
        _with_sidecar(config, body)
    finally:
        os.umask(old)
    assert seen == {"mode": 0o660, "dir mode": 0o750, "stats": "simulated"}
    assert not sock.exists(), "the socket is removed at exit"


def test_socket_mode_is_configurable_and_world_access_needs_the_lab_switch(
        tmp_path: Path) -> None:
    sock = tmp_path / "s" / "x.sock"
    config = _config(tmp_path, f"unix://{sock}", socket_mode="0600")
    seen: dict[str, int] = {}

    async def body() -> None:
        await _wait_serving(f"unix://{sock}")
        seen["mode"] = stat.S_IMODE(sock.stat().st_mode)

    _with_sidecar(config, body)
    assert seen["mode"] == 0o600
    with pytest.raises(ValueError, match="every local user"):
        ServerConfig(listen=f"unix://{sock}", socket_mode=0o666)


def test_a_socket_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by every user"):
        asyncio.run(serve(_config(tmp_path, f"unix://{shared}/s.sock")))


def test_spark_submit_and_sidecar_stats_pass_the_credentials_from_config(
        tmp_path: Path, tls: TlsFiles, token_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa

    from sidecar.cli import main
    from spark_ext.config import SidecarEndpointConfig
    from spark_ext.exceptions import SidecarAuthError
    from spark_ext.submit.submission import submit_batches
    from tests.utils import make_request

    port = free_port()
    target = f"127.0.0.1:{port}"
    config = _config(tmp_path, target, tls_cert_file=str(tls.server_cert),
                     tls_key_file=str(tls.server_key), token_file=str(token_file))
    batch = pa.RecordBatch.from_pylist([make_request(f"s{i}") for i in range(3)])
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    seen: dict[str, object] = {}

    def submit(token: Path) -> object:
        endpoint = SidecarEndpointConfig(endpoint=target, tls_ca_file=str(tls.ca),
                                         token_file=str(token))
        try:
            out = pa.Table.from_batches(list(submit_batches(iter([batch]), endpoint)))
            return out.column("accepted").to_pylist()
        except SidecarAuthError as e:
            return f"auth error: {e}"

    async def body() -> None:
        await _wait_serving(target, ClientSecurity(tls_ca_file=str(tls.ca)))
        seen["good"] = await asyncio.to_thread(submit, token_file)
        seen["wrong"] = await asyncio.to_thread(submit, wrong)
        seen["stats rc"] = await asyncio.to_thread(main, [
            "sidecar-stats", "--target", target, "--json", "--tls-ca-file", str(tls.ca),
            "--token-file", str(token_file)])
        seen["stats wrong token rc"] = await asyncio.to_thread(main, [
            "sidecar-stats", "--target", target, "--tls-ca-file", str(tls.ca),
            "--token-file", str(wrong)])

    _with_sidecar(config, body)
    assert seen["good"] == [True, True, True]
    assert str(seen["wrong"]).startswith("auth error: the sidecar refused the credentials")
    assert seen["stats rc"] == 0 and seen["stats wrong token rc"] == 1
    captured = capsys.readouterr()
    assert '"engine": "simulated"' in captured.out
    assert captured.err.strip().splitlines()[-1] == (
        f"sts: the sidecar refused the credentials: wrong bearer token ({target})")


def test_sidecar_stats_takes_address_and_token_from_the_sidecar_config(
        tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from sidecar.cli import main

    target = f"127.0.0.1:{free_port()}"
    config = _config(tmp_path, target, token_file=str(token_file))
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump({"server": {"listen": target,
                                               "token_file": str(token_file)}}))
    seen: dict[str, object] = {}

    async def body() -> None:
        await _wait_serving(target)
        seen["rc"] = await asyncio.to_thread(main, ["sidecar-stats", "--config", str(path),
                                                    "--json"])

    _with_sidecar(config, body)
    assert seen["rc"] == 0
    assert '"engine": "simulated"' in capsys.readouterr().out


def test_a_socket_another_process_serves_is_not_taken_over(tmp_path: Path) -> None:
    import socket

    sock = tmp_path / "run" / "busy.sock"
    sock.parent.mkdir(mode=0o750)
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(sock))
        other.listen()
        with pytest.raises(ConfigError, match="another process is serving this socket"):
            asyncio.run(serve(_config(tmp_path, f"unix://{sock}")))
    assert sock.exists()  # left alone; a stale one (nobody listening) is replaced
    _with_sidecar(_config(tmp_path, f"unix://{sock}"),
                  lambda: _wait_serving(f"unix://{sock}"))


def test_refused_calls_are_counted_and_the_token_is_never_logged(
        tmp_path: Path, token_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import urllib.request

    target, metrics_port = f"127.0.0.1:{free_port()}", free_port()
    config = _config(tmp_path, target, token_file=str(token_file), metrics_port=metrics_port)
    wrong = tmp_path / "wrong"
    wrong.write_text("guess-1")
    seen: dict[str, object] = {}

    async def body() -> None:
        await _wait_serving(target)
        seen["wrong"] = await _stats(target, ClientSecurity(token_file=str(wrong)))
        seen["none"] = await _stats(target, None)
        seen["good"] = await _stats(target, ClientSecurity(token_file=str(token_file)))
        seen["metrics"] = await asyncio.to_thread(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode())

    with caplog.at_level(logging.DEBUG):
        _with_sidecar(config, body)
    assert (seen["wrong"], seen["none"], seen["good"]) == (
        grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED, "simulated")
    assert 'sts_sidecar_rpc_refused_total{reason="unauthenticated"} 2.0' in seen["metrics"]
    assert 'sts_sidecar_rpc_refused_total{reason="resource_exhausted"} 0.0' in seen["metrics"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Refused /sts.v1.Inference/GetStats: wrong bearer token" in logged
    assert TOKEN not in logged and "guess-1" not in logged
