"""Errors raised by the sidecar (each docstring says whether it is recoverable), and
the one-line form every error message takes."""


class SidecarError(Exception):
    """Base class of sidecar errors."""


class ModelPreparationError(SidecarError):
    """The packaged model could not be found or converted. Unrecoverable for this run."""


class EngineStartError(SidecarError):
    """The engine failed to load its model. Unrecoverable."""


class EngineDeadError(SidecarError):
    """The engine died while serving; every in-flight request ends in ``error``. Unrecoverable."""


class ConfigError(SidecarError, ValueError):
    """A configuration value, flag, file or address is wrong. Unrecoverable for this run;
    the message is one line, ``<what> (<where>)``, printed as ``sts: <message>``."""


class SidecarConfigError(ConfigError):
    """A value of the sidecar's configuration (a field of a section, checked when the
    section is built) is wrong; the message names the field. Unrecoverable for this run.
    The Spark side's counterpart is ``spark_ext.exceptions.PipelineConfigError``."""


class SidecarUnreachableError(SidecarError):
    """A client could not get an answer from the sidecar (not running, wrong address,
    refused credentials). Recoverable: try again once it serves."""


def one_line(error: BaseException | str) -> str:
    """The text of ``error`` on one line: runs of whitespace (newlines included) become
    one space, as every ``sts: <what> (<where>)`` message wants it.

    Example:
        >>> one_line(ValueError("bad value\\n  in section 'server'"))
        "bad value in section 'server'"
    """
    return " ".join(str(error).split())
