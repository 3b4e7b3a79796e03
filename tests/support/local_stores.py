"""A machine's model stores, built in a temporary home from the fixture pair, for the tests of
the models found on this machine (tests/test_local_models.py, test_serve_models.py).

- Ollama (`$HOME/.ollama/models`): the fixture target as `smollm2:135m` (manifest and blob), and
  `smollm2:broken`, whose blob is the fixture draft cut after its header (a truncated download);
- LM Studio (`$HOME/.lmstudio/models`): the fixture draft as `test/SmolLM2-first20-GGUF/...`;
- the Hugging Face cache (`$HOME/hf/hub`, the real layout: blobs, refs, a snapshot's link): the
  fixture target again, as a second copy;
- a user folder (`$HOME/gguf`): a tiny GGUF with a tokenizer of its own (written with gguf's
  GGUFWriter), and a file cut inside its header.

Files are copies, never links to the fixture: a bug that wrote to a store could not reach it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REVISION = "0123456789abcdef0123456789abcdef01234567"
HF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
HF_FILE = "smollm2-135m-instruct-q4_1.gguf"
LMSTUDIO_NAME = "lmstudio:test/SmolLM2-first20-GGUF/smollm2-135m-first20.gguf"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Machine:
    home: Path
    ollama: Path
    lmstudio: Path
    hub: Path
    folder: Path
    names: dict[str, Path] = field(default_factory=dict)  # the names expected, by the file each is

    def env(self) -> dict[str, str]:
        """The environment that points every store at this machine (and nothing else)."""
        return {"HOME": str(self.home), "USERPROFILE": str(self.home), "OLLAMA_MODELS": str(self.ollama),
                "HF_HUB_CACHE": str(self.hub), "HF_HOME": str(self.home / "hf"),
                "SPRINTER_EDGE_HOME": str(self.home / "sprinter-edge"),
                "SPRINTER_EDGE_MODELS_DIRS": str(self.folder), "XDG_CONFIG_HOME": str(self.home / "config"),
                "XDG_CACHE_HOME": str(self.home / ".cache"), "HF_HUB_OFFLINE": "1"}

    def files(self) -> dict[Path, str]:
        """Every file under the stores, with its sha256."""
        out = {}
        for root in (self.ollama, self.lmstudio, self.hub, self.folder):
            for p in sorted(root.rglob("*")):
                if p.is_file() and not p.is_symlink():
                    out[p] = sha256(p)
        return out


def write_foreign_gguf(path: Path, n_vocab: int = 300) -> None:
    """A small complete GGUF (one tensor) whose tokenizer is no other model's."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("foreign")
    w.add_context_length(2048)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(n_vocab)])
    w.add_tensor("token_embd.weight", np.zeros((n_vocab, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def header_size(path: Path) -> int:
    from sprinter_edge.catalog.gguf_header import read_gguf_info

    return read_gguf_info(path).data_offset


def build(home: Path, target: Path, draft: Path) -> Machine:
    m = Machine(home=home, ollama=home / ".ollama" / "models", lmstudio=home / ".lmstudio" / "models",
                hub=home / "hf" / "hub", folder=home / "gguf")
    # Ollama: a manifest per name and tag, the weights as a blob named by their digest
    blobs = m.ollama / "blobs"
    blobs.mkdir(parents=True)
    digest = sha256(target)
    shutil.copyfile(target, blobs / f"sha256-{digest}")
    cut = draft.read_bytes()[:header_size(draft) + (1 << 20)]  # the header and 1 MiB of weights
    cut_digest = hashlib.sha256(cut).hexdigest()
    (blobs / f"sha256-{cut_digest}").write_bytes(cut)
    for tag, d in (("135m", digest), ("broken", cut_digest)):
        manifest = m.ollama / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{d}", "size": 1},
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:00", "size": 1}]}))
    m.names["ollama:smollm2:135m"] = blobs / f"sha256-{digest}"
    m.names["ollama:smollm2:broken"] = blobs / f"sha256-{cut_digest}"
    # LM Studio: publisher/repo/file
    studio = m.lmstudio / "test" / "SmolLM2-first20-GGUF" / "smollm2-135m-first20.gguf"
    studio.parent.mkdir(parents=True)
    shutil.copyfile(draft, studio)
    m.names[LMSTUDIO_NAME] = studio
    # the Hub cache: models--org--name/{blobs/HASH, refs/main, snapshots/REV/FILE -> ../../blobs/HASH}
    repo = m.hub / f"models--{HF_REPO.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    shutil.copyfile(target, repo / "blobs" / digest)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / HF_FILE).symlink_to(Path("..") / ".." / "blobs" / digest)
    m.names[f"hf:{HF_REPO}/{HF_FILE}"] = snapshot / HF_FILE
    # a user folder: a tokenizer of its own, and a file cut inside its header
    m.folder.mkdir(parents=True)
    write_foreign_gguf(m.folder / "foreign.gguf")
    m.names["dir:foreign.gguf"] = m.folder / "foreign.gguf"
    (m.folder / "cut-header.gguf").write_bytes(draft.read_bytes()[:100_000])
    m.names["dir:cut-header.gguf"] = m.folder / "cut-header.gguf"
    for d in ("config", ".cache", "sprinter-edge"):
        (home / d).mkdir(exist_ok=True)
    return m


def point_at(machine: Machine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """This process's environment pointed at `machine` (monkeypatch undoes it)."""
    for key in ("HUGGINGFACE_HUB_CACHE", "SPRINTER_EDGE_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    for key, value in machine.env().items():
        monkeypatch.setenv(key, value)


def subprocess_env(machine: Machine) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HUGGINGFACE_HUB_CACHE", "SPRINTER_EDGE_CONFIG")}
    return {**env, **machine.env(), "PYTHONUNBUFFERED": "1"}
