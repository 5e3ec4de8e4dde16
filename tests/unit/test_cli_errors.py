"""Every config, flag and connection mistake ends in one line ``sts: <what> (<where>)``,
exit code 2 for usage errors and 1 for a sidecar that cannot be reached; no traceback.

The ``sts`` entry point runs in process (``sidecar.cli.main``); cases that get as far
as starting a sidecar use the simulated engine."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sidecar.cli import main
from tests.utils import free_port

pytestmark = pytest.mark.timeout(60)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = int(e.code or 0)
    err = capsys.readouterr().err.strip()
    return rc, err


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    # Logging lines (timestamped) may come first; the error is the last line, alone.
    assert lines and lines[-1].startswith("sts: "), err
    assert "Traceback" not in err, err
    return lines[-1]


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def sidecar_args(tmp_path: Path) -> list[str]:
    """A config that starts (simulated engine) apart from the mistake each test adds."""
    return ["sidecar", "--config", _yaml(tmp_path, "engine: {kind: simulated}\n"),
            "--results-dir", str(tmp_path / "results")]


CONFIG_FILE_CASES = {
    "missing file": (None, r"^sts: config file not found \(.*nope\.yaml\)$"),
    "malformed YAML": ("server: {listen: [\n",
                       r"^sts: config file is not valid YAML: .*line \d+\)$"),
    "not a mapping": ("- a\n- b\n",
                      r"^sts: config file must hold a mapping of sections, not a list"),
    "unknown section": ("servr: {}\n",
                        r"^sts: unknown sidecar config sections: \['servr'\] \(.*\)$"),
    "unknown key": ("server: {lisen: x}\n",
                    r"^sts: unknown keys in sidecar config section 'server': \['lisen'\] \("),
    "unknown nested key": ("scheduler: {pools: {low: {max_qeued: 1}}}\n",
                           r"^sts: unknown keys in scheduler.pools.low: \['max_qeued'\] \("),
    "bad value": ("scheduler: {max_in_flight: 0}\n",
                  r"^sts: self.max_in_flight=0 must be a positive integer \("),
    "bad type": ("results: {flush_interval_s: fast}\n",
                 r"^sts: bad value in sidecar config section 'results': .* \("),
    "section not a mapping": ("server: 5\n",
                              r"^sts: sidecar config section 'server' must be a mapping, got int"),
    "bad engine kind": ("engine: {kind: tgi}\n", r"^sts: engine.kind: 'tgi' is not one of vllm, simulated"),
    "bad socket mode": ("server: {socket_mode: '0999'}\n",
                        r"^sts: server.socket_mode='0999' must be an octal mode"),
    "unknown event loop": ("server: {event_loop: trio}\n",
                           r"^sts: server.event_loop='trio' must be one of \('auto', "),
    "cert without key": ("server: {tls_cert_file: c.pem}\n",
                         r"^sts: server.tls_cert_file and server.tls_key_file go together"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_FILE_CASES))
def test_config_file_mistakes(case: str, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    text, pattern = CONFIG_FILE_CASES[case]
    path = str(tmp_path / "nope.yaml") if text is None else _yaml(tmp_path, text)
    rc, err = _run(capsys, ["sidecar", "--config", path])
    assert rc == 2
    assert _one_line(err) == err.splitlines()[-1]
    import re
    assert re.search(pattern, _one_line(err)), err


FLAG_CASES = {
    "unknown flag": (["--bogus"], r"^sts: unrecognized arguments: --bogus \(sts\)$"),
    "bad int": (["--max-in-flight", "many"],
                r"^sts: argument --max-in-flight: invalid int value: 'many' \(sts sidecar\)$"),
    "bad choice": (["--engine", "tgi"], r"^sts: argument --engine: invalid choice"),
    "bad flag value": (["--max-in-flight", "0"],
                       r"^sts: self.max_in_flight=0 must be a positive integer \(flags\)$"),
    "bad metrics port": (["--metrics-port", "70000"], r"must be a TCP port \(flags\)$"),
    "--set without =": (["--set", "scheduler.max_in_flight"],
                        r"^sts: expected KEY=VALUE, got 'scheduler.max_in_flight' \(--set\)$"),
    "--set unknown key": (["--set", "scheduler.max_inflight=3"],
                          r"^sts: unknown config key 'scheduler.max_inflight' \(--set\)$"),
    "--set bad value": (["--set", "scheduler.pools.low.weight=-1"],
                        r"^sts: pool weight=-1 must be a positive integer \(--set\)$"),
    "--engine-arg without =": (["--engine-arg", "max_num_seqs"],
                               r"^sts: expected KEY=VALUE, got 'max_num_seqs' \(--engine-arg\)$"),
    "malformed listen": (["--listen", "nonsense"],
                         r"^sts: listen address must be host:port or unix:///path.sock, got "
                         r"'nonsense' \(server.listen\)$"),
    "remote without auth": (["--listen", "0.0.0.0:50999"],
                            r"^sts: refusing to listen on 0.0.0.0:50999 without TLS or a token.*"
                            r"\(server.listen\)$"),
    "token variable unset": (["--set", "server.token_env=STS_TEST_NO_SUCH_VAR"],
                             r"^sts: token variable is not set or empty \(STS_TEST_NO_SUCH_VAR\)$"),
    "token file missing": (["--set", "server.token_file=/no/such/token"],
                           r"^sts: cannot read the token file: No such file or directory "
                           r"\(/no/such/token\)$"),
    "certificate missing": (["--set", "server.tls_cert_file=/no/cert.pem",
                             "--set", "server.tls_key_file=/no/key.pem"],
                            r"^sts: cannot read the server certificate: .* \(/no/cert.pem\)$"),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_flag_mistakes(case: str, sidecar_args: list[str],
                       capsys: pytest.CaptureFixture[str]) -> None:
    import re

    extra, pattern = FLAG_CASES[case]
    argv = ["--bogus", *sidecar_args] if case == "unknown flag" else [*sidecar_args, *extra]
    rc, err = _run(capsys, argv)
    assert rc == 2
    assert re.search(pattern, _one_line(err)), err


def test_a_busy_port_is_one_line_and_nothing_is_left_running(
        sidecar_args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        listen = f"127.0.0.1:{busy.getsockname()[1]}"
        rc, err = _run(capsys, [*sidecar_args, "--listen", listen])
    assert rc == 2
    assert _one_line(err).startswith("sts: cannot listen on this address")
    assert _one_line(err).endswith(f"({listen})")


def test_socket_directory_writable_by_all(sidecar_args: list[str], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    rc, err = _run(capsys, [*sidecar_args, "--listen", f"unix://{shared}/s.sock"])
    assert rc == 2
    assert _one_line(err) == f"sts: the socket directory is writable by every user ({shared})"


def test_sidecar_stats_without_a_sidecar(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"127.0.0.1:{free_port()}"
    rc, err = _run(capsys, ["sidecar-stats", "--target", target])
    assert rc == 1
    line = _one_line(err)
    assert line.startswith("sts: cannot reach the sidecar: ") and line.endswith(f"({target})")


@pytest.mark.parametrize("flags, pattern", [
    (["--token-file", "/no/such/token"], r"cannot read the token file: .* \(/no/such/token\)$"),
    (["--tls-ca-file", "/no/ca.pem"], r"cannot read the CA bundle: .* \(/no/ca.pem\)$"),
    (["--tls-cert-file", "c.pem"], r"tls_cert_file and tls_key_file go together .* \(flags\)$"),
])
def test_sidecar_stats_credential_mistakes(flags: list[str], pattern: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import re

    rc, err = _run(capsys, ["sidecar-stats", "--target", "127.0.0.1:1", *flags])
    assert rc == 2
    assert re.search(pattern, _one_line(err)), err


@pytest.mark.parametrize("text, pattern", [
    (None, r"^sts: config file not found \(.*nope\.yaml\)$"),
    ("sidecar: {endpoint: [\n", r"^sts: config file is not valid YAML: .*line \d+\)$"),
    ("sidecar: {endpont: x}\n", r"^sts: unknown keys in pipeline config section 'sidecar'"),
    ("answers: {grace_ms: -1}\n", r"^sts: self.grace_ms=-1 must be >= 0 \(.*\.yaml\)$"),
    ("sidecar: {tls_cert_file: c.pem}\n",
     r"^sts: sidecar: tls_cert_file and tls_key_file go together"),
])
def test_pipeline_job_config_mistakes(text: str | None, pattern: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from spark_ext.pipeline.job import main as job_main

    path = tmp_path / "nope.yaml"
    if text is not None:
        path.write_text(text)
    assert job_main(["--config", str(path)]) == 2
    assert re.search(pattern, _one_line(capsys.readouterr().err))


@pytest.mark.parametrize("argv, pattern", [
    (["bench", "--profile", "no-such", "--duration", "1"],
     r"^sts: no traffic profile 'no-such' .* \(sts bench\)$"),
    (["plan", "--profile", "no-such"], r"^sts: no traffic profile 'no-such' .* \(sts plan\)$"),
    (["demo", "--rate", "fast"], r"^sts: argument --rate: not a number: 'fast' "
                                 r"\(sts demo\)$"),
])
def test_harness_and_benchmark_command_mistakes(argv: list[str], pattern: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import re

    rc, err = _run(capsys, argv)
    assert rc == 2
    assert re.search(pattern, _one_line(err)), err


def test_a_sidecar_that_does_not_start_is_one_line(tmp_path: Path) -> None:
    from sts_harness.process import SidecarProcess, SidecarStartError

    with pytest.raises(SidecarStartError) as err:
        with SidecarProcess(tmp_path / "results", ["--config", str(tmp_path / "nope.yaml")]):
            pass
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("Server exited unexpectedly: sts: config file not found (")
    assert message.endswith(f"({tmp_path / 'results.log'})")


@pytest.mark.timeout(120)
def test_a_spark_that_does_not_start_is_one_line(tmp_path: Path) -> None:
    """``sts demo`` whose JVM cannot start (no Java at ``JAVA_HOME``): one line and exit
    code 1, not PySpark's traceback. In a child process: this one may hold a session."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, "-m", "sidecar.cli", "demo", "--engine", "simulated",
                           "--duration", "1", "--out", str(tmp_path / "demo")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_line(done.stderr)
    assert line.startswith("sts: Spark did not start: ") and line.endswith("(sts demo)"), line
    assert f"(log: {tmp_path / 'demo' / 'demo.log'})" in line  # the traceback is there
    assert "Traceback" in (tmp_path / "demo" / "demo.log").read_text()
    assert "INCOMPLETE" in done.stdout


def test_uvloop_asked_for_but_missing_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    rc, err = _run(capsys, ["sidecar", "--engine", "simulated",
                            "--set", "server.event_loop=uvloop"])
    assert rc == 2
    assert _one_line(err) == ("sts: server.event_loop='uvloop' but uvloop is not installed "
                              "(pip install uvloop, or use 'auto' or 'asyncio')")
