"""A full disk while `pull` downloads from the Hub and while it derives the draft, on the fixture
model: one line naming the file it could not write and the disk's room, no half file where a
complete one would be looked for, what was there before intact, and the next `pull` with room
finishes the job.

A real ENOSPC: the cache on a small tmpfs, grown afterwards with a remount (root, as CI runs;
tests/test_disk.py mounts the same way). The Hub is tests/hub_standin.py on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hub_standin import HubStandIn
from support.disks import tmpfs

from sprinter_edge.catalog.registry import Derivation, load_registry
from sprinter_edge.catalog.store import quantize, sha256_file

REVISION = "0123456789abcdef0123456789abcdef01234567"
DISK_ERROR_EXIT = 9
MIB = 1 << 20


def small_disk(path: Path, size: int) -> contextlib.AbstractContextManager[Path]:
    """A tmpfs of `size` bytes (rounded up to MiB) at `path` until the block ends."""
    return tmpfs(path, f"{-(-size // MIB)}m")


def grow(disk: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={-(-size // MIB)}m", str(disk)], check=True)


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sprinter_edge", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)


PROGRESS = re.compile(r": +\d+%\|")  # a progress bar's line (tqdm), redrawn with carriage returns
AMOUNTS = re.compile(r"\(([\d,]+) bytes needed, ([\d,]+) bytes free\)")


def one_error_line(stderr: str) -> str:
    """The whole of what the user reads, progress bars aside: one `sprinter-edge: error:` line
    (no traceback, no warning)."""
    lines = [line for line in stderr.replace("\r", "\n").splitlines()
             if line.strip() and not PROGRESS.search(line)]
    assert len(lines) == 1 and lines[0].startswith("sprinter-edge: error: "), stderr
    return lines[0]


def amounts(line: str) -> tuple[int, int]:
    """The bytes needed and the bytes free the line reports."""
    m = AMOUNTS.search(line)
    assert m, line
    return int(m[1].replace(",", "")), int(m[2].replace(",", ""))


def entry(name: str, path: Path) -> str:
    """A registry entry for the model file at `path`, on the Hub stand-in's repository."""
    return (f'[models."{name}"]\nrepo = "tests/tiny"\nfile = "{path.name}"\n'
            f'revision = "{REVISION}"\nsize = {path.stat().st_size}\nsha256 = "{sha256_file(path)}"\n'
            'license = "apache-2.0"\n')


def pair(draft: str, target: str) -> str:
    return (f'default_pair = "tiny"\n[pairs."tiny"]\ndraft = "{draft}"\ntarget = "{target}"\n'
            'tokenizer = "smollm2"\n')


def hub_files(hf: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """The Hugging Face cache's snapshot files, complete blobs and partial (`.incomplete`) files."""
    snapshots = list(hf.rglob("snapshots/*/*"))
    blobs = [p for p in hf.rglob("blobs/*") if not p.name.endswith(".incomplete")]
    incomplete = list(hf.rglob("*.incomplete"))
    return snapshots, blobs, incomplete


def unchecked(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The CLI with its size check out of the way (`store.check_space`): the write itself meets
    the full disk, as when the disk fills up while it writes."""
    code = ("from sprinter_edge.catalog import store\n"
            "store.check_space = lambda *args, **kwargs: None\n"
            "from sprinter_edge.cli import main\n"
            f"raise SystemExit(main({args!r}))\n")
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------- the Hub

@pytest.mark.slow
def test_full_disk_during_a_hub_download(tmp_path: Path, fixture_target_path: Path,
                                         fixture_draft_path: Path) -> None:
    """The Hugging Face cache on a disk with room for the draft and half the target. `pull`
    gets the draft whole, then refuses the target before downloading it (the registry knows its
    size) in one line naming the cache, the bytes needed and the disk's bytes free, and the
    variable that moves it; with that check out of the way the download meets the kernel's own
    ENOSPC mid-file and the same line comes out. Either way the draft is intact, no target file
    is left where one is looked for, nor any partial blob (huggingface_hub writes a file of its
    own per download and deletes it when the download fails), and once the disk has room the
    next `pull` gets the target and verifies it."""
    draft, target = fixture_draft_path, fixture_target_path
    size = target.stat().st_size
    registry = tmp_path / "pairs.toml"
    registry.write_text(pair("tiny-draft", "tiny-target") + entry("tiny-draft", draft)
                        + entry("tiny-target", target))
    room = draft.stat().st_size + size // 2
    with (HubStandIn("tests/tiny", REVISION, {draft.name: draft, target.name: target}) as hub,
          small_disk(tmp_path / "hf", room) as hf):
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(hf), "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_XET": "1", "SPRINTER_EDGE_HOME": str(tmp_path / "home"),
               "SPRINTER_EDGE_REGISTRY": str(registry)}

        def target_gets() -> int:
            return sum(m == "GET" and target.name in path for m, path, _ in hub.requests)

        def only_the_draft() -> None:
            snapshots, blobs, incomplete = hub_files(hf)
            assert [p.name for p in snapshots] == [draft.name]  # no target where one is looked for
            assert len(blobs) == 1 and sha256_file(blobs[0]) == sha256_file(draft)  # the draft: whole
            assert not incomplete  # nothing partial
            assert not list((tmp_path / "home").rglob("*.gguf*"))

        r = cli(["pull"], env)
        assert r.returncode == DISK_ERROR_EXIT, r.stderr
        line = one_error_line(r.stderr)
        repo_cache = hf / "hub" / "models--tests--tiny"
        assert f"cannot write {repo_cache}: the disk is full" in line, line
        assert line.endswith("; free some space or point HF_HOME at a larger disk"), line
        needed, free = amounts(line)
        assert needed == size and free == shutil.disk_usage(hf).free < size, line  # this disk's room
        assert target_gets() == 0  # refused before the download
        only_the_draft()

        r = unchecked(["pull"], env)
        assert r.returncode == DISK_ERROR_EXIT, r.stderr
        line = one_error_line(r.stderr)
        assert "the disk is full" in line and str(hf) in line and "HF_HOME" in line, line
        needed, free = amounts(line)
        # the room it reports is the disk's once the download's own file is gone
        assert needed == size and free == shutil.disk_usage(hf).free < size, line
        assert target_gets() >= 1  # this time the download ran into the full disk
        only_the_draft()

        grow(hf, draft.stat().st_size + size + 8 * MIB)
        r = cli(["pull"], env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("sha256 ok") == 2, r.stdout
        snapshots, blobs, incomplete = hub_files(hf)
        assert sorted(p.name for p in snapshots) == sorted([draft.name, target.name])
        assert sorted(sha256_file(p) for p in blobs) == sorted([sha256_file(draft), sha256_file(target)])
        assert not incomplete


# ---------------------------------------------------------------------------- the derived draft

@pytest.fixture(scope="module")
def derived(fixture_target_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    """Size and sha256 of the fixture model derived by the default draft's recipe (Q4_0, head
    Q4_0) with this llama.cpp: what the registry entry below expects."""
    out = tmp_path_factory.mktemp("derive") / "first.gguf"
    default_draft = load_registry().pair("default").draft
    assert default_draft.derived is not None  # the default draft is derived on the machine
    recipe = Derivation(source=replace(default_draft.derived.source, name="fixture"),
                        ftype=default_draft.derived.ftype,
                        output_tensor_type=default_draft.derived.output_tensor_type)
    quantize(fixture_target_path, out, recipe)
    size, sha = out.stat().st_size, sha256_file(out)
    out.unlink()
    return size, sha


@pytest.fixture()
def derive_env(tmp_path: Path, fixture_target_path: Path, derived: tuple[int, str]):
    """A registry whose draft is derived from the target (as the default pair's is from the
    0.5B), the target on the Hub stand-in, the Hugging Face cache on the real disk."""
    size, sha = derived
    src = fixture_target_path
    default_draft = load_registry().pair("default").draft
    recipe = default_draft.derived
    head = f', output_tensor_type = "{recipe.output_tensor_type}"' if recipe.output_tensor_type else ""
    registry = tmp_path / "pairs.toml"
    registry.write_text(
        pair("tiny-q4_0", "tiny-target") + entry("tiny-target", src)
        + f'[models."tiny-q4_0"]\nfile = "tiny-q4_0.gguf"\n'
          f'derived = {{ from = "tiny-target", ftype = "{recipe.ftype}"{head} }}\n'
          f'size = {size}\nsha256 = "{sha}"\nlicense = "apache-2.0"\n')
    with HubStandIn("tests/tiny", REVISION, {src.name: src}) as hub:
        yield hub, {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"),
                    "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1",
                    "HF_HUB_DISABLE_PROGRESS_BARS": "1", "SPRINTER_EDGE_REGISTRY": str(registry)}


@pytest.mark.slow
def test_full_disk_while_deriving_the_draft(tmp_path: Path, derive_env, derived: tuple[int, str],
                                            fixture_target_path: Path) -> None:
    """SPRINTER_EDGE_HOME on a disk with room for half the derived draft. `pull` downloads the
    source, then refuses to derive (the registry knows the size) in one line naming the file,
    the bytes needed and the disk's bytes free; with that check out of the way llama.cpp's
    quantizer runs into the kernel's own ENOSPC mid-write, and the same one line comes out.
    Either way no `.partial` or half draft is left, the source and the checksum index are
    intact, and the next `pull` with room derives the draft."""
    hub, env = derive_env
    size, sha = derived
    with small_disk(tmp_path / "home", size // 2) as home:
        env = {**env, "SPRINTER_EDGE_HOME": str(home)}
        dest = home / "models" / "tiny-q4_0.gguf"
        r = cli(["pull"], env)
        assert r.returncode == DISK_ERROR_EXIT, r.stderr
        line = one_error_line(r.stderr)
        assert f"cannot write {dest}: the disk is full" in line, line
        assert line.endswith("; free some space or point SPRINTER_EDGE_HOME at a larger disk"), line
        needed, free = amounts(line)
        assert needed == size and free == shutil.disk_usage(home).free < size, line
        assert list(home.rglob("*.gguf*")) == []  # the draft: nothing written, nothing half
        source = [p for p in (tmp_path / "hf").rglob("snapshots/*/*") if p.name == fixture_target_path.name]
        assert len(source) == 1 and sha256_file(source[0]) == sha256_file(fixture_target_path)
        index = (home / "verified.json").read_text()  # the source's checksum, recorded
        assert str(source[0].resolve()) in json.loads(index)

        r = unchecked(["pull", "--offline"], env)
        assert r.returncode == DISK_ERROR_EXIT, r.stderr
        line = one_error_line(r.stderr)
        assert f"cannot write {dest}: the disk is full" in line, line
        needed, free = amounts(line)
        assert needed == size and free < MIB, line  # llama.cpp filled the disk before it failed
        assert list(home.rglob("*.gguf*")) == []  # the half-written .partial is gone
        assert (home / "verified.json").read_text() == index
        assert sha256_file(source[0]) == sha256_file(fixture_target_path)

        grow(home, size + 8 * MIB)
        r = cli(["pull", "--offline"], env)
        assert r.returncode == 0, r.stderr
        assert dest.stat().st_size == size and sha256_file(dest) == sha
        assert [p.name for p in home.rglob("*.gguf*")] == [dest.name]
