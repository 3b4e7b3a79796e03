"""The models an Engine decodes with: a target and, optionally, a draft that shares its tokenizer.

Each loads on first use. The draft is priced before it is ever loaded, so a plan that never
drafts never pays for it: from its cached costs when an earlier load of the same file recorded
them (its tokenizer checked against the target's from that record), else from the target's costs
scaled by the files' sizes (`prior_costs`), which are measured in place when a plan first loads it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backend import native
from .backend.llama import LlamaModel, LoadOptions, check_gguf_file, default_gpu_layers
from .catalog.registry import PairSpec, load_registry
from .catalog.store import ensure_model
from .costs.pricing import Costs
from .costs.table import CostTable, cached_file_costs, machine_costs, prior_costs
from .errors import SprinterError, TokenizerMismatchError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hardware:
    """Where and how the models run. GPU layers: 0 = CPU only, -1 = every layer; by default every
    layer where this build has a GPU here, else none (`default_gpu_layers`)."""

    n_threads: int | None = None  # None: the performance cores (backend/host.py)
    n_ctx: int | None = None  # None: the model's trained context up to AUTO_CTX (backend/llama.py)
    draft_gpu_layers: int = field(default_factory=default_gpu_layers)
    target_gpu_layers: int = field(default_factory=default_gpu_layers)
    n_batch: int = 512
    flash_attn: str = "auto"  # "on", "off", or "auto": off for repacked weights on the CPU (LoadOptions)
    target_rpc: tuple[str, ...] = ()  # rpc-servers (HOST:PORT) holding the target (backend/rpc.py)

    def options(self, role: str) -> LoadOptions:
        layers = self.draft_gpu_layers if role == "draft" else self.target_gpu_layers
        return LoadOptions(n_ctx=self.n_ctx, n_threads=self.n_threads,
                           n_gpu_layers=-1 if layers < 0 else layers, n_batch=self.n_batch,
                           flash_attn=self.flash_attn, rpc=self.target_rpc if role == "target" else ())


class ModelPair:
    """A target and an optional draft, loaded on first use and checked against each other."""

    def __init__(self, target_path: Path, draft_path: Path | None, hardware: Hardware):
        self.target_path, self.draft_path, self.hardware = target_path, draft_path, hardware
        self._target: LlamaModel | None = None
        self._draft: LlamaModel | None = None
        self._draft_prior: CostTable | None = None  # the draft's costs guessed, until it loads
        # the cost tables got from the cache or measured, by role: only these learn from the
        # replies' calls and are stored again (never a planner's set from outside)
        self.measured: dict[str, CostTable] = {}

    @property
    def target(self) -> LlamaModel:
        if self._target is None:
            self._target = LlamaModel(self.target_path, self.hardware.options("target"))
            if self._draft is not None:
                check_same_tokenizer(self._draft, self._target)
        return self._target

    @property
    def draft(self) -> LlamaModel:
        """The draft, loaded (and checked against the target's tokenizer) on first use."""
        if self.draft_path is None:
            raise SprinterError("no draft model configured")
        if self._draft is None:
            log.info("loading the draft %s", self.draft_path.name)
            draft = LlamaModel(self.draft_path, self.hardware.options("draft"))
            if self._target is not None:
                try:
                    check_same_tokenizer(draft, self._target)
                except TokenizerMismatchError:
                    draft.close()
                    raise
            self._draft = draft
            if self._draft_prior is not None:  # the planner priced it unmeasured: measure it now
                self._draft_prior.replace_with(machine_costs(draft))
                self.measured["draft"], self._draft_prior = self._draft_prior, None
        return self._draft

    def text_model(self, needs_target: bool) -> LlamaModel:
        """The model whose tokenizer and chat template are used (they are shared): the target,
        unless it is not loaded and the method does not need it."""
        return self.target if self._target is not None or needs_target else self.draft

    def loaded(self, role: str) -> LlamaModel | None:
        """The model of `role` ("target" | "draft") if it is loaded, else None (nothing loads)."""
        return self._target if role == "target" else self._draft

    def draft_costs(self) -> CostTable:
        """The draft's decode costs for the planner, without loading the draft where it can (see
        the module's docstring)."""
        assert self.draft_path is not None
        if self._draft is None:
            found = cached_file_costs(self.draft_path, self.hardware.options("draft"))
            if found is not None:
                target = self.target
                if found.n_vocab != target.n_vocab or found.tokenizer_hash != target.tokenizer_hash():
                    raise TokenizerMismatchError(tokenizer_mismatch(
                        self.draft_path.name, found.n_vocab, target.path.name, target.n_vocab))
                return found.table
            check_gguf_file(self.draft_path)  # a missing or foreign file is refused now, not mid-reply
            self._draft_prior = prior_costs(machine_costs(self.target), self.draft_path, self.target_path)
            return self._draft_prior
        return machine_costs(self.draft)

    def learners(self, costs: Costs) -> dict[str, tuple[LlamaModel | None, CostTable | None]]:
        """Per role, the loaded model and its table in `costs` where that table is one this pair
        measured or read from the cache (the only ones that learn from replies and are stored)."""
        return {role: (self.loaded(role), table if table is not None and table is self.measured.get(role)
                       else None)
                for role, table in (("target", costs.target), ("draft", costs.draft))}

    def cached_target_costs(self) -> CostTable | None:
        """The loaded target's cached costs (None: not loaded, or never timed here)."""
        if self._target is None:
            return None
        found = cached_file_costs(self.target_path, self.hardware.options("target"))
        return found.table if found is not None else None

    def is_prior(self, table: CostTable | None) -> bool:
        """`table` is the draft's guessed costs (not measured yet)."""
        return table is not None and table is self._draft_prior

    def placement(self) -> str:
        """Where the loaded models' layers are, one line: "target 31/31 layers on GPU (Metal),
        draft 31/31 layers on GPU (Metal)", "target and draft on the CPU (this build has no GPU
        offload)"."""
        loaded = [(role, m.placement()) for role, m in (("target", self._target), ("draft", self._draft))
                  if m is not None]
        if not loaded:
            return "no model loaded yet"
        if len(loaded) == 2 and loaded[0][1] == loaded[1][1]:
            line = f"target and draft {loaded[0][1]}"
        else:
            line = ", ".join(f"{role} {where}" for role, where in loaded)
            if self.draft_path is not None and self._draft is None:
                line += ", draft not loaded yet"
        if not native.gpu_offload_supported() and "GPU" not in line and "rpc-server" not in line:
            line += " (this build has no GPU offload)"
        return line

    def layers_on(self) -> str:
        """Where the loaded models' layers are, in a word or two: "GPU", "CPU", "GPU+CPU",
        "rpc-server+CPU" (the chat page shows it)."""
        places: list[str] = []
        for m in (self._target, self._draft):
            if m is None:
                continue
            if m.gpu_layers:
                places.append("rpc-server" if m.rpc_devices is not None else "GPU")
            if m.gpu_layers < m.layers:
                places.append("CPU")
        return "+".join(dict.fromkeys(sorted(places, key=("rpc-server", "GPU", "CPU").index))) or "-"

    def decoded_tokens(self) -> int:
        """Tokens the target has decoded since it loaded, prompts read included (0: not loaded)."""
        return self._target.decoded_tokens if self._target is not None else 0

    def reset(self) -> None:
        """Empty both KV caches."""
        for m in (self._draft, self._target):
            if m is not None:
                m.reset()

    def close(self) -> None:
        for m in (self._draft, self._target):
            if m is not None:
                m.close()
        self._draft = self._target = None


def fetch_pair(name: str, *, target: bool, draft: bool, download: bool, offline: bool,
               progress: bool) -> tuple[PairSpec, Path, Path | None]:
    """A registered pair and the paths of the files asked for, fetched where they are missing
    (a target not asked for is a placeholder path, never loaded)."""
    pair = load_registry().pair(name)

    def fetch(model: Any) -> Path:
        return ensure_model(model, download=download, offline=offline, progress=progress)

    return pair, fetch(pair.target) if target else Path("<not loaded>"), fetch(pair.draft) if draft else None


def check_same_tokenizer(draft: LlamaModel, target: LlamaModel) -> None:
    if draft.n_vocab != target.n_vocab or draft.tokenizer_hash() != target.tokenizer_hash():
        raise TokenizerMismatchError(tokenizer_mismatch(draft.path.name, draft.n_vocab,
                                                        target.path.name, target.n_vocab))


def tokenizer_mismatch(draft: str, draft_vocab: int, target: str, target_vocab: int) -> str:
    return (f"draft {draft} and target {target} do not share a tokenizer "
            f"(vocab {draft_vocab} vs {target_vocab}); speculative decoding needs one "
            "vocabulary. Pick a draft from the target's model family.")
