"""Collecting verifier training data from a draft/target pair.

For each prompt the draft decodes greedily (chat template, temperature 0). For every
drafted token we keep what a verifier sees at run time -- the draft's final hidden state at
the position that produced the token, the draft's max probability and entropy at
temperature 1 -- and, from ONE target call over prompt + continuation, what the target
thinks of the token:

* `label_greedy`: draft argmax == target argmax (what greedy SPRINTER needs);
* `label_paper`: q(x) <= p(x) at temperature 1 (the SPRINTER paper's label);
* `tv`: TV(p, q) at that position, both at temperature 1: the calibration table's drift
  per token at threshold t is the mean of 1[score >= t] * tv (the greedy drift needs only
  `label_greedy`, since the collected token is the draft's argmax).

Data goes to compressed `.npz` shards (a few prompts each) plus `meta.json`; a shard that
exists is skipped, so an interrupted or time-limited run resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..backend.llama import LlamaModel
from ..decoding.run_policy import RunPolicy
from ..decoding.sampling import SamplingParams
from ..errors import SprinterError
from ..numerics import confidence, softmax
from ..prompting import prompt_tokens, render_chat
from . import onpolicy
from .corpus import Corpus, CorpusPrompt, domain_of, prompt_groups

log = logging.getLogger(__name__)

FORMAT = "sprinter-edge-verifier-data-v1"
FORMAT_ON_POLICY = "sprinter-edge-verifier-data-v2"
POLICIES = ("draft-greedy", "sprinter")
LABEL_RULES = {
    "greedy": "draft argmax == target argmax",
    "paper": "q(x) <= p(x), both at temperature 1 (SPRINTER paper)",
}
# Arrays saved per token, in every shard.
FIELDS = ("hidden", "max_prob", "entropy", "output_position", "run_position", "token",
          "target_token", "p_x", "q_x", "tv", "label_greedy", "label_paper", "prompt_index")
# Fields a collection may lack (older or partial data): left out of `load_data` when any shard lacks them.
OPTIONAL_FIELDS = ("tv",)


@dataclass(frozen=True)
class CollectConfig:
    max_new_tokens: int = 96
    shard_size: int = 4  # prompts per shard
    seed: int = 0  # prompt order
    limit: int | None = None  # prompts at most
    time_budget_s: float | None = None
    run_cap: int = 20  # for the simulated run position (on-policy: the decoder's run cap)
    policy: str = "draft-greedy"  # or "sprinter": SPRINTER's own trajectories (`onpolicy`)
    temperatures: tuple[float, ...] = (0.0,)  # on-policy: one trajectory per prompt at each


@dataclass
class CollectSummary:
    shards_written: int = 0
    shards_skipped: int = 0
    prompts: int = 0
    tokens: int = 0
    seconds: float = 0.0
    stopped_by_budget: bool = False


def draft_greedy(draft: LlamaModel, prompt: list[int], max_new: int) -> tuple[list[int], np.ndarray,
                                                                              np.ndarray]:
    """Greedy continuation (end-of-generation token excluded), the draft's logits and hidden
    state at each position that produced a continuation token."""
    if len(prompt) > 1:
        draft.sync(prompt[:-1], n_logits=0)
    else:
        draft.reset()
    out = draft.eval(prompt[-1:], n_logits=1, hidden=True)
    tokens: list[int] = []
    logits_rows: list[np.ndarray] = []
    hidden_rows: list[np.ndarray] = []
    while len(tokens) < max_new:
        logits = out.logits[0]
        tok = int(np.argmax(logits))
        if draft.is_eog(tok):
            break
        assert out.hidden is not None
        tokens.append(tok)
        logits_rows.append(logits.copy())
        hidden_rows.append(out.hidden[0].astype(np.float16))
        if len(tokens) < max_new:
            out = draft.eval([tok], n_logits=1, hidden=True)
    d = draft.n_embd
    return (tokens, np.array(logits_rows, np.float32).reshape(len(tokens), -1),
            np.array(hidden_rows, np.float16).reshape(len(tokens), d))


def _chat_prompt(draft: LlamaModel, target: LlamaModel, item: CorpusPrompt,
                 cfg: CollectConfig) -> list[int] | None:
    text = render_chat(target, [{"role": "user", "content": item.prompt}])
    prompt = prompt_tokens(target, text, chat_rendered=True)
    if len(prompt) + cfg.max_new_tokens + 2 > min(draft.n_ctx, target.n_ctx):
        log.warning("prompt %s too long for the context, skipped", item.id)
        return None
    return prompt


def on_policy_record(draft: LlamaModel, target: LlamaModel, item: CorpusPrompt, index: int,
                     group: int, cfg: CollectConfig,
                     behaviour: onpolicy.Behaviour) -> dict[str, np.ndarray] | None:
    """SPRINTER's trajectories on one prompt, one per temperature, concatenated."""
    prompt = _chat_prompt(draft, target, item, cfg)
    if prompt is None:
        return None
    parts = []
    for t in cfg.temperatures:
        params = SamplingParams(temperature=t, seed=onpolicy.prompt_seed(item.id, t))
        rows = onpolicy.trajectory(draft, target, prompt, params, behaviour, cfg.max_new_tokens)
        if rows:
            parts.append(onpolicy.records(rows, prompt_index=index, group=group, domain=domain_of(item)))
    if not parts:
        return None
    return {f: np.concatenate([p[f] for p in parts]) for f in onpolicy.FIELDS}


def prompt_record(draft: LlamaModel, target: LlamaModel, item: CorpusPrompt, index: int,
                  cfg: CollectConfig) -> dict[str, np.ndarray] | None:
    prompt = _chat_prompt(draft, target, item, cfg)
    if prompt is None:
        return None
    cont, q_logits, hidden = draft_greedy(draft, prompt, cfg.max_new_tokens)
    n = len(cont)
    if n == 0:
        return None
    out = target.sync(prompt + cont, n_logits=n + 1)
    rec: dict[str, list[float]] = {k: [] for k in ("max_prob", "entropy", "target_token", "p_x",
                                                    "q_x", "tv")}
    for i, tok in enumerate(cont):
        mp, ent = confidence(q_logits[i])
        p = softmax(out.logits[i])
        q = softmax(q_logits[i])
        rec["max_prob"].append(mp)
        rec["entropy"].append(ent)
        rec["target_token"].append(int(np.argmax(out.logits[i])))
        rec["p_x"].append(float(p[tok]))
        rec["q_x"].append(float(q[tok]))
        rec["tv"].append(0.5 * float(np.abs(p - q).sum()))  # elementwise: no BLAS call
    tokens = np.array(cont, np.int32)
    target_tok = np.array(rec["target_token"], np.int32)
    greedy = tokens == target_tok
    p_x = np.array(rec["p_x"], np.float32)
    q_x = np.array(rec["q_x"], np.float32)
    return {
        "hidden": hidden,
        "max_prob": np.array(rec["max_prob"], np.float32),
        "entropy": np.array(rec["entropy"], np.float32),
        "output_position": np.arange(n, dtype=np.int32),
        "run_position": simulated_run_position(greedy, cfg.run_cap),
        "token": tokens,
        "target_token": target_tok,
        "p_x": p_x,
        "q_x": q_x,
        "tv": np.array(rec["tv"], np.float32),
        "label_greedy": greedy.astype(np.uint8),
        "label_paper": (q_x <= p_x).astype(np.uint8),
        "prompt_index": np.full(n, index, np.int32),
    }


def simulated_run_position(greedy_ok: np.ndarray, cap: int) -> np.ndarray:
    """Run position under an oracle verifier (a run ends at each disagreement or the cap):
    the run position a verifier sees at run time depends on its own decisions."""
    oracle = RunPolicy(threshold=0.5, run_cap=cap)  # passes exactly the agreeing tokens
    walked = oracle.walk([1.0 if ok else 0.0 for ok in np.asarray(greedy_ok).tolist()])
    return np.fromiter((run for _, run in walked), np.int32, len(greedy_ok))


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.npz"


def pair_meta(draft: LlamaModel, target: LlamaModel) -> dict[str, object]:
    return {
        "draft": {"file": draft.path.name, "fingerprint": draft.fingerprint(), "n_embd": draft.n_embd,
                  "n_vocab": draft.n_vocab, "description": draft.description},
        "target": {"file": target.path.name, "fingerprint": target.fingerprint(),
                   "n_embd": target.n_embd, "n_vocab": target.n_vocab,
                   "description": target.description},
        "tokenizer": draft.tokenizer_hash()[:16],
    }


def _write_meta(out_dir: Path, meta: dict[str, object]) -> None:
    tmp = out_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(out_dir / "meta.json")


def _check_resume(out_dir: Path, meta: dict[str, object]) -> None:
    path = out_dir / "meta.json"
    if not path.exists():
        return
    old = json.loads(path.read_text())
    for key in ("format", "pair", "corpus", "corpus_digest", "config", "behaviour"):
        was, now = old.get(key), json.loads(json.dumps(meta.get(key)))  # as written: tuples are lists
        if was != now:
            detail = f" (it has {was}, this run {now})" if key in ("config", "behaviour") else ""
            raise SprinterError(f"{out_dir} holds data collected with another {key}{detail}; "
                                "resume with the same settings or use a new --data directory")


def _batches(items: list[CorpusPrompt], size: int) -> Iterator[tuple[int, list[CorpusPrompt]]]:
    for k in range(0, len(items), size):
        yield k // size, items[k : k + size]


def _check_policy(cfg: CollectConfig, behaviour: onpolicy.Behaviour | None) -> bool:
    """Whether the collection is on-policy (SPRINTER's own trajectories); a bad policy raises."""
    if cfg.policy not in POLICIES:
        raise SprinterError(f"unknown collection policy {cfg.policy!r}; choose from {', '.join(POLICIES)}")
    if cfg.policy == "sprinter" and behaviour is None:
        raise SprinterError("the on-policy collection needs a behaviour verifier and threshold")
    return cfg.policy == "sprinter"


def collect(draft: LlamaModel, target: LlamaModel, corpus: Corpus, out_dir: str | Path,
            cfg: CollectConfig | None = None, *, behaviour: onpolicy.Behaviour | None = None,
            progress: bool = True) -> CollectSummary:
    """Collect shards into out_dir (resumable). Returns what was done.

    `behaviour` (the verifier and threshold the trajectories are decoded with) is required
    by the on-policy collection (`cfg.policy == "sprinter"`)."""
    from threadpoolctl import threadpool_limits
    from tqdm import tqdm

    cfg = cfg or CollectConfig()
    on_policy = _check_policy(cfg, behaviour)
    fields = onpolicy.FIELDS if on_policy else FIELDS
    groups = prompt_groups(corpus.prompts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    order = corpus.shuffled(cfg.seed)
    if cfg.limit is not None:
        order = order[: cfg.limit]
    index_of = {p.id: i for i, p in enumerate(corpus.prompts)}
    meta: dict[str, object] = {
        "format": FORMAT_ON_POLICY if on_policy else FORMAT,
        "pair": pair_meta(draft, target),
        "corpus": corpus.name,
        "corpus_digest": corpus.digest(),
        "prompt_ids": [p.id for p in corpus.prompts],
        "config": asdict(cfg) | {"limit": None, "time_budget_s": None},
        "sampling": ({"trajectories": "SPRINTER decoding at each of config.temperatures (top-k, "
                      "top-p off)", "probabilities": "at the sampling temperature (1 under greedy)"}
                     if on_policy else
                     {"draft": "greedy (temperature 0)", "probabilities": "temperature 1, full vocab"}),
        "fields": list(fields),
        "hidden": {"dtype": "float16", "what": "draft final hidden state (after output norm) at the "
                   "position whose logits produced the token"},
        "label_rules": LABEL_RULES,
    }
    if on_policy:
        assert behaviour is not None
        meta["behaviour"] = behaviour.describe()
        meta["prompts"] = [{"id": p.id, "category": p.category, "domain": domain_of(p), "group": g}
                           for p, g in zip(corpus.prompts, groups, strict=True)]
    _check_resume(out, meta)
    _write_meta(out, meta)
    summary = CollectSummary()
    t0 = time.monotonic()
    bar = tqdm(total=len(order), unit="prompt", disable=not progress, desc="collect")
    # numpy must not wake BLAS threads: they spin and halve llama.cpp's speed on small machines
    with threadpool_limits(1):
        for k, batch in _batches(order, cfg.shard_size):
            path = out / shard_name(k)
            if path.exists():
                summary.shards_skipped += 1
                bar.update(len(batch))
                continue
            records: list[dict[str, np.ndarray]] = []
            for item in batch:
                if cfg.time_budget_s is not None and time.monotonic() - t0 > cfg.time_budget_s:
                    summary.stopped_by_budget = True
                    break
                i = index_of[item.id]
                rec = (on_policy_record(draft, target, item, i, groups[i], cfg, behaviour)  # type: ignore[arg-type]
                       if on_policy else prompt_record(draft, target, item, i, cfg))
                if rec is not None:
                    records.append(rec)
                    summary.tokens += len(rec["token"])
                summary.prompts += 1
                bar.update(1)
                bar.set_postfix(tokens=summary.tokens)
            if records and not summary.stopped_by_budget:
                _save_shard(path, records, fields)
                summary.shards_written += 1
            if summary.stopped_by_budget:
                log.info("time budget reached: the unfinished shard was dropped (rerun to resume)")
                break
    bar.close()
    summary.seconds = time.monotonic() - t0
    return summary


def _save_shard(path: Path, records: list[dict[str, np.ndarray]], fields: tuple[str, ...]) -> None:
    arrays = {f: np.concatenate([r[f] for r in records]) for f in fields}
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def load_data(data_dir: str | Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """All shards of a collection, concatenated, and its metadata."""
    d = Path(data_dir)
    meta_path = d / "meta.json"
    if not meta_path.exists():
        raise SprinterError(f"no verifier data in {d} (meta.json missing): run `verifier collect`")
    meta = json.loads(meta_path.read_text())
    shards = sorted(d.glob("shard-*.npz"))
    shards = [s for s in shards if not s.name.endswith(".tmp.npz")]
    if not shards:
        raise SprinterError(f"no shards in {d}")
    fields = tuple(meta.get("fields", FIELDS))
    parts: dict[str, list[np.ndarray]] = {f: [] for f in fields}
    missing: set[str] = set()
    for s in shards:
        with np.load(s) as z:
            for f in fields:
                if f not in z.files and f in OPTIONAL_FIELDS:
                    missing.add(f)
                    continue
                parts[f].append(z[f])
    if missing:
        log.warning("%s: some shards lack %s: left out", d, ", ".join(sorted(missing)))
    return {f: np.concatenate(v) for f, v in parts.items() if f not in missing}, meta
