"""`sprinter-edge models`' second part: the GGUF files already on this machine (catalog/local.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..catalog import local


def add_local_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local", action="store_true",
                   help="only the GGUF files found on this machine (with --json: them, as a list)")
    p.add_argument("--models-dir", action="append", default=[], metavar="DIR",
                   help="another folder of GGUF files to look in (repeatable; also "
                        "SPRINTER_EDGE_MODELS_DIRS and the config file's dirs)")


def places(dirs: list[str]) -> list[str]:
    """Where models are looked for, for the line that says nothing was found."""
    out = [f"Ollama {p}" for p in local.ollama_stores()]
    out += [f"LM Studio {p}" for p in local.lmstudio_stores()]
    out += [f"the Hugging Face cache {local.hf_hub_cache()}", f"pulled {local.pulled_store()}"]
    out += [f"folder {p}" for p in local.user_dirs(dirs)]
    return out


def size_text(n: int) -> str:
    if not n:
        return "?"
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"


def rows(found: local.Found) -> list[dict[str, Any]]:
    groups = found.tokenizer_groups()
    out = []
    for m in found.models:
        i = m.info
        draft = found.draft_for(m) if m.usable else None
        out.append({
            "name": m.name, "source": m.source, "path": str(m.path), "size": m.size,
            "architecture": i.architecture if i else None, "model_name": i.name if i else None,
            "params": i.params_label if i else None, "n_params": i.n_params if i else None,
            "size_label": i.size_label if i else None,
            "quant": i.file_type if i else None, "context": i.context_length if i else None,
            "tokenizer": groups.get(i.tokenizer) if i and i.tokenizer else None,
            "tokenizer_model": i.tokenizer_model if i else None, "n_vocab": i.n_vocab if i else None,
            "tokenizer_fingerprint": i.tokenizer if i else None,
            "problem": m.problem, "draft": draft.name if draft else None,
        })
    return out


def print_found(args: argparse.Namespace) -> None:
    found = local.find_models(args.models_dir)
    listed = rows(found)
    if args.json:
        print(json.dumps(listed, indent=2))
        return
    print("on this machine (Ollama, LM Studio, the Hugging Face cache, `pull`, your folders): "
          "--target NAME runs one; with no --draft, its draft is the smallest model here, smaller "
          "than it, with its tokenizer")
    if not listed:
        print("  no GGUF files found; looked in " + "; ".join(places(args.models_dir)))
        return
    width = min(max(len(r["name"]) for r in listed), 60)
    print(f"  {'name':{width}} {'size':>8}  {'arch':12} {'params':>6}  {'quant':8} {'context':>7}  "
          f"{'tokenizer':12}  draft")
    for r in listed:
        head = f"  {r['name']:{width}} {size_text(r['size']):>8}  "
        if r["architecture"] is None or r["problem"]:
            print(head + f"cannot be used: {r['problem']}")
            continue
        vocab = f"{r['tokenizer']} ({r['n_vocab']:,})" if r["tokenizer"] else "none"
        print(head + f"{r['architecture']:12} {r['params'] or '?':>6}  {r['quant'] or '?':8} "
              f"{r['context'] or '?':>7}  {vocab:12}  {r['draft'] or '-'}")
    shared = {}
    for r in listed:
        if r["tokenizer"] and not r["problem"]:
            shared[r["tokenizer"]] = shared.get(r["tokenizer"], 0) + 1
    pairs = [t for t, n in shared.items() if n > 1]
    print("  tokenizer: models with the same letter share one (a draft and its target must); "
          + (f"{', '.join(pairs)} {'is' if len(pairs) == 1 else 'are'} shared" if pairs
             else "no two models here share one (`sprinter-edge pull` gets a pair)"))
