"""The GGUF models already on this machine, each under a name a user would type.

Where they are found, in this order:

- `ollama:NAME:TAG`: Ollama's store, `$OLLAMA_MODELS` when set, else `~/.ollama/models` (macOS,
  Windows, a Linux user install) and `/usr/share/ollama/.ollama/models` (the Linux service). A
  manifest per name and tag (`manifests/registry.ollama.ai/library/NAME/TAG`, JSON) names the
  weights' blob (`blobs/sha256-HEX`, a GGUF file). Another namespace keeps it in the name
  (`ollama:NS/NAME:TAG`), another registry too (`ollama:hf.co/USER/REPO:TAG`).
- `lmstudio:PUBLISHER/REPO/FILE.gguf`: LM Studio's `~/.lmstudio/models` (older versions:
  `~/.cache/lm-studio/models`).
- `hf:REPO_ID/FILE.gguf`: the Hugging Face cache (`huggingface_hub.scan_cache_dir`, at HF_HUB_CACHE,
  HF_HOME/hub or ~/.cache/huggingface/hub): the newest snapshot of each file.
- `pulled:NAME`: what `sprinter-edge pull` put in this package's cache.
- `dir:RELATIVE/PATH.gguf`: folders the user names: `--models-dir`, SPRINTER_EDGE_MODELS_DIRS
  (separated by os.pathsep) and `dirs = [...]` in the config file (`config_path()`).

Each file's header is read (catalog/gguf_header.py), never its weights, and remembered by path,
size, mtime and inode in this package's cache, so listing again reads nothing. Nothing here
writes, copies or moves a user's model file. A file that cannot be used (a truncated blob, not
GGUF, a manifest whose blob is gone) is listed with one line saying why, and the rest still are.

A name may be shortened to any unique tail of it (`lmstudio:REPO/FILE`, `FILE`, `FILE` without
`.gguf`, an Ollama name without its tag meaning `:latest`); a path is a path.

Pairing (`pair`): with no draft named, the draft is the smallest other usable model, smaller than
the target, whose tokenizer fingerprint equals the target's (the header's: a sufficient condition
for the loader's own check, `model_pair.check_same_tokenizer`, which still runs at load).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from difflib import get_close_matches
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..errors import ModelFileError, SettingsError
from ..resources import cache_dir
from .gguf_header import GGUFInfo, read_gguf_info

log = logging.getLogger(__name__)

SOURCES = ("ollama", "lmstudio", "hf", "pulled", "dir")
ENV_DIRS = "SPRINTER_EDGE_MODELS_DIRS"
ENV_CONFIG = "SPRINTER_EDGE_CONFIG"
OLLAMA_SYSTEM_STORE = Path("/usr/share/ollama/.ollama/models")  # the Linux service's
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY, OLLAMA_LIBRARY = "registry.ollama.ai", "library"
MAX_DEPTH = 4  # folders below a user's (or LM Studio's) models folder that are searched
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's split files: the first is loaded
HEADER_CACHE_VERSION = 1


# ---------------------------------------------------------------------------- where
def config_path() -> Path:
    """The models config file: SPRINTER_EDGE_CONFIG, else `sprinter-edge/models.toml` in the user's
    config folder (XDG_CONFIG_HOME or ~/.config; %APPDATA% on Windows)."""
    env = os.environ.get(ENV_CONFIG)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or (os.environ.get("APPDATA") if os.name == "nt" else None)
    return (Path(base).expanduser() if base else Path.home() / ".config") / "sprinter-edge" / "models.toml"


def load_config() -> dict:
    """The config file's settings ({} when there is none): `dirs` (folders of GGUF files) and
    `serve` (names or patterns of the models `serve` offers)."""
    path = config_path()
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read the config file {path}: {exc}") from None
    for key in ("dirs", "serve"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SettingsError(f"{path}: {key} must be a list of strings")
    return data


def user_dirs(extra: Iterable[str | Path] = ()) -> list[Path]:
    """The user's model folders: `extra` (--models-dir), then SPRINTER_EDGE_MODELS_DIRS, then the
    config file's `dirs`; each once."""
    env = [d for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d]
    out: list[Path] = []
    for d in (*extra, *env, *load_config().get("dirs", [])):
        path = Path(d).expanduser()
        if path not in out:
            out.append(path)
    return out


def ollama_stores() -> list[Path]:
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return [Path(env).expanduser()]
    stores = [Path.home() / ".ollama" / "models"]
    if sys.platform.startswith("linux"):
        stores.append(OLLAMA_SYSTEM_STORE)
    return stores


def lmstudio_stores() -> list[Path]:
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def hf_hub_cache() -> Path:
    """The Hugging Face cache, read from the environment now (huggingface_hub's own constant is
    fixed when it is imported)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def pulled_store() -> Path:
    from .store import models_cache

    return models_cache()


# ---------------------------------------------------------------------------- what
@dataclass(frozen=True)
class LocalModel:
    """One GGUF file found on this machine, under the name to type."""

    name: str  # "ollama:smollm2:135m"
    source: str  # one of SOURCES, or "path" for a file named by its path
    path: Path  # the file llama.cpp loads (a blob, a snapshot's link, a split file's first part)
    size: int = 0  # bytes on disk (every part of a split model)
    info: GGUFInfo | None = None
    error: str | None = None  # why it cannot be used, in one line

    @property
    def problem(self) -> str | None:
        """Why this model cannot be loaded, or None."""
        if self.error is not None:
            return self.error
        if self.info is not None and not self.info.complete:
            return (f"truncated: the file has {self.info.file_size:,} of the {self.info.data_end:,} "
                    "bytes its tensors need (an interrupted download?)")
        return None

    @property
    def usable(self) -> bool:
        return self.info is not None and self.problem is None

    @property
    def short(self) -> str:
        """The name after its source's prefix."""
        return self.name.split(":", 1)[1] if self.source in SOURCES else self.name

    def same_file(self, other: LocalModel | Path) -> bool:
        other_path = other.path if isinstance(other, LocalModel) else other
        try:
            return os.path.samefile(self.path, other_path)
        except OSError:
            return False


class HeaderCache:
    """GGUF headers by file, kept in this package's cache (`local-models.json`) and keyed by the
    file's resolved path, size, mtime and inode: a file read once is not read again until it
    changes. Headers of one file reached by several names (hard links, links) are read once."""

    def __init__(self, path: Path | None = None):
        self.path = path if path is not None else cache_dir() / "local-models.json"
        self.entries: dict[str, dict] = {}
        self.dirty = False
        self.reads = 0  # headers read from their files (not from the cache)
        self._by_inode: dict[tuple[int, int], GGUFInfo] = {}  # read in this run: hard links once
        self._touched: set[str] = set()
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("version") == HEADER_CACHE_VERSION:
                self.entries = data.get("files", {})
        except (OSError, ValueError, AttributeError):
            pass

    def info(self, path: Path) -> GGUFInfo:
        """`path`'s header; ModelFileError for a file that is not a readable GGUF."""
        try:
            st = path.stat()
            key = str(path.resolve())
        except OSError as exc:
            raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        self._touched.add(key)
        entry = self.entries.get(key)
        if entry is not None and entry.get("stamp") == stamp:
            try:
                return GGUFInfo(path=path, **entry["info"])
            except TypeError:  # an entry of another layout
                pass
        seen = self._by_inode.get((st.st_dev, st.st_ino)) if st.st_ino else None
        if seen is not None and seen.file_size == st.st_size:
            return replace(seen, path=path)
        info = read_gguf_info(path)
        self.reads += 1
        self._by_inode[(st.st_dev, st.st_ino)] = info
        fields = asdict(info)
        del fields["path"]
        self.entries[key] = {"stamp": stamp, "info": fields}
        self.dirty = True
        return info

    def save(self, *, prune: bool = False) -> None:
        """Write the cache back (best effort: it is only a cache); `prune`: keep only the files
        asked about since it was read (after a whole listing: the files gone are forgotten)."""
        if prune and set(self.entries) - self._touched:
            self.entries = {k: v for k, v in self.entries.items() if k in self._touched}
            self.dirty = True
        if not self.dirty:
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"version": HEADER_CACHE_VERSION, "files": self.entries}),
                           encoding="utf-8")
            os.replace(tmp, self.path)
            self.dirty = False
        except OSError as exc:
            log.debug("cannot write %s: %s", self.path, exc)
            tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- finding
Candidate = tuple[str, str, Path, str | None]  # (name, source, path, error)


def _gguf_files(root: Path, depth: int = MAX_DEPTH) -> list[Path]:
    """GGUF files under `root`, `depth` folders deep at most, hidden folders and a split model's
    later parts and multimodal projectors (mmproj) left out; sorted."""
    out: list[Path] = []
    if not root.is_dir():
        return out
    base = len(root.parts)
    for folder, dirs, files in os.walk(root, followlinks=True):
        here = Path(folder)
        if len(here.parts) - base >= depth:
            dirs[:] = []
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in files:
            if not f.lower().endswith(".gguf") or "mmproj" in f.lower():
                continue
            part = SPLIT_PART.search(f)
            if part is not None and int(part.group(1)) != 1:
                continue
            out.append(here / f)
    return sorted(out)


def _split_size(path: Path) -> int:
    """Bytes of every part of a split model (one file: its size)."""
    part = SPLIT_PART.search(path.name)
    try:
        if part is None:
            return path.stat().st_size
        stem, total = path.name[:part.start()], int(part.group(2))
        return sum((path.parent / f"{stem}-{i:05d}-of-{total:05d}.gguf").stat().st_size
                   for i in range(1, total + 1))
    except OSError:
        return 0


def _ollama(store: Path) -> Iterator[Candidate]:
    manifests = store / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file() and not p.name.startswith(".")):
        parts = manifest.relative_to(manifests).parts
        if len(parts) < 4:
            continue
        host, *namespace, model, tag = parts
        ns = "/".join(namespace)
        ref = (f"{model}:{tag}" if (host, ns) == (OLLAMA_REGISTRY, OLLAMA_LIBRARY)
               else f"{ns}/{model}:{tag}" if host == OLLAMA_REGISTRY else f"{host}/{ns}/{model}:{tag}")
        name = f"ollama:{ref}"
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
            digest = next((layer["digest"] for layer in layers
                           if layer.get("mediaType") == OLLAMA_MODEL_LAYER), None)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            yield name, "ollama", manifest, f"unreadable Ollama manifest {manifest}: {exc}"
            continue
        if not isinstance(digest, str):
            yield name, "ollama", manifest, "its Ollama manifest names no model layer"
            continue
        blob = store / "blobs" / digest.replace(":", "-")
        if not blob.is_file():
            yield name, "ollama", blob, f"its blob {blob.name} is missing from {store / 'blobs'}"
            continue
        yield name, "ollama", blob, None


def _hf(hub: Path) -> Iterator[Candidate]:
    if not hub.is_dir():
        return
    try:
        from huggingface_hub import scan_cache_dir
    except ImportError:  # pragma: no cover - a core dependency
        return
    try:
        scanned = scan_cache_dir(hub)
    except Exception as exc:  # a cache it cannot read: one line, the other stores still listed
        log.warning("cannot scan the Hugging Face cache %s: %s", hub, exc)
        return
    for repo in sorted(scanned.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        seen: set[str] = set()
        # a file in several snapshots: the one a ref (main) points at, else the newest
        for rev in sorted(repo.revisions, key=lambda r: (bool(r.refs), r.last_modified), reverse=True):
            for f in sorted(rev.files, key=lambda f: str(f.file_path)):
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                low = rel.lower()
                if not low.endswith(".gguf") or "mmproj" in low or rel in seen:
                    continue
                part = SPLIT_PART.search(rel)
                if part is not None and int(part.group(1)) != 1:
                    continue
                seen.add(rel)
                yield f"hf:{repo.repo_id}/{rel}", "hf", f.file_path, None


def _folder(root: Path, source: str, prefix: str) -> Iterator[Candidate]:
    for path in _gguf_files(root, 1 if source == "pulled" else MAX_DEPTH):
        rel = path.relative_to(root).as_posix()
        yield f"{prefix}:{path.stem if source == 'pulled' else rel}", source, path, None


def candidates(dirs: Sequence[Path] = ()) -> Iterator[Candidate]:
    for store in ollama_stores():
        yield from _ollama(store)
    for store in lmstudio_stores():
        yield from _folder(store, "lmstudio", "lmstudio")
    yield from _hf(hf_hub_cache())
    yield from _folder(pulled_store(), "pulled", "pulled")
    for d in dirs:
        yield from _folder(d, "dir", "dir")


def find_models(dirs: Iterable[str | Path] = (), *, cache: HeaderCache | None = None) -> Found:
    """Every GGUF model on this machine (see the module's docstring); `dirs`: --models-dir."""
    cache = cache if cache is not None else HeaderCache()
    models: list[LocalModel] = []
    names: set[str] = set()
    for name, source, path, error in candidates(user_dirs(dirs)):
        if name in names:  # a second user folder with the same file: its path tells them apart
            name = f"{source}:{path}"
            if name in names:
                continue
        names.add(name)
        models.append(_model(name, source, path, error, cache))
    cache.save(prune=True)
    return Found(models)


def _model(name: str, source: str, path: Path, error: str | None, cache: HeaderCache) -> LocalModel:
    if error is not None:
        return LocalModel(name, source, path, error=error)
    try:
        info = cache.info(path)
    except ModelFileError as exc:
        return LocalModel(name, source, path, size=_size(path), error=str(exc))
    return LocalModel(name, source, path, size=_split_size(path) if info.split_count > 1 else info.file_size,
                      info=info)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def path_model(path: Path, cache: HeaderCache | None = None) -> LocalModel:
    """A file named by its path, as a LocalModel (its header read where it can be)."""
    return _model(str(path), "path", path, None, cache if cache is not None else HeaderCache())


# ---------------------------------------------------------------------------- resolving
@dataclass
class Found:
    """The models found, and resolving a name the user typed against them."""

    models: list[LocalModel] = field(default_factory=list)

    def usable(self) -> list[LocalModel]:
        return [m for m in self.models if m.usable]

    def lookup(self, text: str) -> LocalModel:
        """The model `text` names: its whole name or a unique tail of it (see the module's
        docstring). ModelFileError when none is, SettingsError when several are."""
        source, _, rest = text.partition(":")
        if source in SOURCES:
            pool = [m for m in self.models if m.source == source]
        else:
            source, rest, pool = "", text, self.models
        exact = [m for m in pool if m.name == text or m.short == rest]
        if not exact and source in ("", "ollama") and ":" not in rest:
            exact = [m for m in pool if m.source == "ollama" and m.short == f"{rest}:latest"]
        found = exact or [m for m in pool if _tail_match(m.short, rest)]
        if len(found) == 1:
            return found[0]
        if found:
            listed = ", ".join(m.name for m in found[:8]) + (", ..." if len(found) > 8 else "")
            raise SettingsError(f"{text!r} could be any of {len(found)} models: {listed}; give more "
                                "of the name")
        near = get_close_matches(text, [m.name for m in self.models], n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise ModelFileError(f"no model {text!r}: not a file, and none of the {len(self.models)} models "
                             f"found on this machine is called that{hint}; `sprinter-edge models` "
                             "lists them")

    def draft_for(self, target: LocalModel) -> LocalModel | None:
        """The smallest usable model smaller than `target` whose tokenizer is the target's."""
        if target.info is None or target.info.tokenizer is None:
            return None
        fits = [m for m in self.usable()
                if m.info is not None and m.info.tokenizer == target.info.tokenizer
                and m.size < target.size and not m.same_file(target)]
        return min(fits, key=lambda m: (m.size, m.name), default=None)

    def tokenizer_groups(self) -> dict[str, str]:
        """Tokenizer fingerprint -> a short label (A, B, ..., Z, A1, ...) shared by every model
        with that tokenizer, in the order they were found."""
        groups: dict[str, str] = {}
        for m in self.models:
            if m.info is not None and m.info.tokenizer is not None and m.info.tokenizer not in groups:
                n = len(groups)
                groups[m.info.tokenizer] = chr(ord("A") + n % 26) + (str(n // 26) if n >= 26 else "")
        return groups


def _tail_match(short: str, query: str) -> bool:
    return any(name == query or name.endswith("/" + query) for name in (short, short.removesuffix(".gguf")))


def looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.lower().endswith(".gguf")


def resolve(text: str, found: Found | None, *, dirs: Iterable[str | Path] = ()) -> tuple[LocalModel, Found]:
    """What `--target` or `--draft` TEXT names: an existing file's path, else one of the models
    found (found now unless `found` is given). A model that cannot be used is refused here with
    its one line, before llama.cpp reads it."""
    path = Path(text).expanduser()
    source = text.split(":", 1)[0]
    if source not in SOURCES and path.is_file():
        return path_model(path), found if found is not None else Found()
    found = found if found is not None and found.models else find_models(dirs)
    try:
        model = found.lookup(text)
    except ModelFileError:
        if source not in SOURCES and looks_like_path(text):
            raise ModelFileError(f"model file not found: {path}") from None
        raise
    if model.problem is not None:
        raise ModelFileError(f"{model.name} ({model.path}): {model.problem}")
    return model, found


@dataclass(frozen=True)
class Pairing:
    """A target and its draft, and whether the draft was found here (no --draft given)."""

    target: LocalModel
    draft: LocalModel | None
    found_draft: bool = False

    def describe(self) -> str:
        """One line: which target, which draft and why."""
        line = f"target {self.target.name}"
        if self.draft is None:
            return line + ", no draft"
        why = (" (found here: the smallest model smaller than the target with its tokenizer)"
               if self.found_draft else "")
        return f"{line}, draft {self.draft.name}{why}"


NO_DRAFT = ("none", "")


def pair(target: str, draft: str | None, *, dirs: Iterable[str | Path] = (),
         found: Found | None = None) -> Pairing:
    """The files `--target` and `--draft` name (`--draft none`: no draft); with no --draft, the
    draft found here for the target (Found.draft_for), if any."""
    dirs = tuple(dirs)
    target_model, found = resolve(target, found, dirs=dirs)
    if draft is not None and draft.lower() in NO_DRAFT:
        return Pairing(target_model, None)
    if draft is not None:
        return Pairing(target_model, resolve(draft, found, dirs=dirs)[0])
    if not found.models:
        found = find_models(dirs)
    return Pairing(target_model, found.draft_for(target_model), found_draft=True)
