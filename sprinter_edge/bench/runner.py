"""Run every method on every prompt, interleaved prompt by prompt.

For each prompt `ar` runs first (its greedy output is the reference for the quality
columns and for the oracle verifier), then the other methods in an order rotated per
prompt, so slow drifts of a shared machine spread over all methods alike. Speed ratios are
taken against `ar` measured in the same run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..api import Engine
from ..decoding import Origin, SamplingParams, Stats
from ..decoding.sprinter import Sprinter
from ..grammar import compile as compile_constraint
from ..grammar.spec import Constraint
from ..methods import get_strategy, methods
from ..verifiers.base import Verifier
from ..verifiers.loading import resolve_verifier
from ..verifiers.operating_point import OperatingPoint
from ..verifiers.simple import Oracle
from . import edits, memory, quality, structured
from .llama_server import SERVER_CONFIGS, SERVER_METHODS, LlamaServer, parse_server_row, server_stats
from .peers import LlamaCppPeer
from .prompts import BenchPrompt

log = logging.getLogger(__name__)

ORACLE = "oracle"  # sprinter with the oracle verifier: what a verifier that never errs would do
LLAMA_CPP_METHODS = ("llama-cpp", "llama-cpp-draft", "llama-cpp-lookup")  # llama-cpp-python
PEER_METHODS = LLAMA_CPP_METHODS + SERVER_METHODS


# the engine's methods are read from the registry when asked (a method registered later is there)
def engine_methods() -> tuple[str, ...]:
    return (*methods(), ORACLE)


def swept() -> tuple[str, ...]:
    """Approximate methods that a verifier runs: one row per threshold or preset."""
    return tuple(m for m in methods() if not get_strategy(m).exact and get_strategy(m).needs_verifier)


def all_methods() -> tuple[str, ...]:
    return engine_methods() + PEER_METHODS
# `auto+prediction`: the method with the edit's input code as OpenAI's Predicted Output
PREDICTION = "+prediction"
# `ar+free`: the method without the structured prompts' JSON schema (what the constraint buys)
FREE = "+free"
# a peer row's own plain decoding, for its "vs own plain" ratio
PLAIN_PEER = {**dict.fromkeys(LLAMA_CPP_METHODS, "llama-cpp"),
              **dict.fromkeys(SERVER_METHODS, "llama-server")}


@dataclass(frozen=True)
class MethodSpec:
    """One row of the report: a decoding method with its settings."""

    label: str  # the row's name: base_method and its settings ("sprinter@0.5", "auto+prediction")
    base_method: str  # the method the row runs, one of all_methods() (summary rows: "base_method")
    threshold: float | None = None
    preset: str | None = None  # sprinter: a named operating point, resolved per request (domain)
    verifier: str | None = None  # sprinter: this verifier spec instead of the engine's
    prediction: bool = False  # edits: the input code sent as the client's predicted output
    free: bool = False  # structured prompts: decoded without their JSON schema
    server_options: tuple[str, ...] = ()  # llama-server rows: options added to the configuration's

    @property
    def is_reference(self) -> bool:
        """The `ar` row every ratio and agreement column is taken against."""
        return self.base_method == "ar" and not (self.prediction or self.free)

    @property
    def engine_method(self) -> str:
        return Sprinter.name if self.base_method == ORACLE else self.base_method

    @property
    def needs_draft(self) -> bool:
        """The row cannot run without a draft model (sd, sprinter, a peer's draft mode, ...)."""
        if self.base_method in SERVER_CONFIGS:
            return SERVER_CONFIGS[self.base_method][1]
        if self.base_method in LLAMA_CPP_METHODS:
            return self.base_method == "llama-cpp-draft"
        return get_strategy(self.engine_method).needs_draft

    @property
    def uses_verifier(self) -> bool:
        """The row's method scores draft tokens (sprinter, oracle, auto)."""
        return self.base_method in engine_methods() and get_strategy(self.engine_method).needs_verifier


def split_methods(spec: str) -> list[str]:
    """The rows of a comma-separated --methods (commas inside a row's [settings] kept)."""
    return [m.strip() for m in re.split(r",(?![^\[]*\])", spec) if m.strip()]


def expand_methods(names: Sequence[str], thresholds: Sequence[float] | None,
                   presets: Sequence[str] = (), verifiers: Sequence[str] = ()) -> list[MethodSpec]:
    """`sprinter` becomes one row per threshold, or per named preset (resolved by the engine
    for each prompt's domain, as a user's --preset is), else the verifier's default; and
    those rows once per verifier in `verifiers` (labelled `[spec]`) when more than one."""
    specs: list[MethodSpec] = []
    for name in names:
        base = name.removesuffix(PREDICTION)
        if base != name:  # an engine method with the edit's input as its Predicted Output
            if base not in methods():
                raise ValueError(f"{name!r}: only the engine's methods take a prediction "
                                 f"({', '.join(methods())})")
            specs.append(MethodSpec(name, base, prediction=True))
            continue
        base = name.removesuffix(FREE)
        if base != name:  # an engine method that ignores the structured prompts' schema
            if base not in methods():
                raise ValueError(f"{name!r}: only the engine's methods run free of the schema "
                                 f"({', '.join(methods())})")
            specs.append(MethodSpec(name, base, free=True))
            continue
        server = parse_server_row(name)
        if server is not None:  # a llama-server configuration with settings of its own
            specs.append(MethodSpec(name, server[0], server_options=server[1]))
            continue
        if name not in all_methods():
            raise ValueError(f"unknown method {name!r}; choose from {', '.join(all_methods())}")
        if name not in swept():
            specs.append(MethodSpec(name, name))
            continue
        for v in (verifiers if len(verifiers) > 1 else [None]):
            tag = f"[{v}]" if v else ""
            if thresholds:
                specs += [MethodSpec(f"{name}@{t:g}{tag}", name, t, verifier=v) for t in thresholds]
            elif presets:
                specs += [MethodSpec(f"{name}:{p}{tag}", name, preset=p, verifier=v) for p in presets]
            else:
                specs.append(MethodSpec(f"{name}{tag}", name, verifier=v))
    if not any(s.is_reference for s in specs):
        specs.insert(0, MethodSpec("ar", "ar"))  # the reference every ratio needs
    return specs


@functools.lru_cache(maxsize=64)
def _constraint(schema: str) -> Constraint:
    """A structured prompt's schema (its JSON text) as the engine rows' constraint, built once."""
    return Constraint.json_schema(schema, strict=True)


@dataclass
class RunRecord:
    """One method on one prompt."""

    method: str
    prompt_id: str
    workload: str  # the prompt's (BenchPrompt.workload; "prompt_kind" in older bench.json files)
    text: str
    tokens: list[int]
    stats: dict
    new_tokens: int
    decode_seconds: float
    tokens_per_second: float
    peak_rss_mib: float
    rouge_l: float | None = None
    exact_match: bool | None = None
    prefix_agreement: float | None = None
    mean_logprob: float | None = None
    greedy_agreement: float | None = None
    false_pass: dict | None = None
    humaneval: dict | None = None
    edit: dict | None = None  # edits.EditCheck: passed, edit, why, failure
    structured: dict | None = None  # structured.StructuredCheck: passed, length, why, accuracy
    origins: list[Origin] = field(default_factory=list, repr=False)
    engine_stats: Stats | None = field(default=None, repr=False)  # ar and the engine's methods

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("origins")
        d.pop("engine_stats")
        return d


@dataclass
class RunConfig:
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0  # under sampling, prompt i is decoded with seed + i by every row
    warmup: bool = True
    humaneval_timeout: float = 10.0
    peer_ctx: int = 2048  # llama-cpp-python peers: at most this, else what the prompts need
    server_ctx: int = 4096  # llama-server: the engine rows' context
    server_binary: Path | None = None  # llama-server (tools/build_llama_server.sh); None: no server rows
    no_repack: bool = False  # load the servers' weights without repacking, as the engine does here
    flash_attn: str = "auto"  # the peers' flash attention ("on", "off", "auto"): the engine's
    threads: int | None = None
    # an rpc-server for each llama-server row, in order: its target's layers go there (its draft stays
    # here); an rpc-server serves one client at a time
    target_rpc: tuple[str, ...] = ()
    draft_len: int = 4
    # "all": every run is re-scored by the target (log-prob, agreement, drift columns);
    # "verifier": only runs with tokens the target never saw (the eta_FP and drift columns);
    # "none": no re-scoring (speed, pass@1 and agreement with ar only)
    rescore: str = "all"


class Runner:
    def __init__(self, engine: Engine, specs: Sequence[MethodSpec], config: RunConfig,
                 *, target_path: Path | None = None, draft_path: Path | None = None,
                 verifiers: dict[str, Verifier] | None = None):
        self.engine = engine
        self.specs = list(specs)
        self.config = config
        self.target_path = target_path or engine.target_path
        self.draft_path = draft_path or engine.draft_path
        self.peers: dict[str, LlamaCppPeer | LlamaServer] = {}
        self.peer_ctx = config.peer_ctx
        self.verifiers = dict(verifiers or {})  # spec -> loaded verifier (the rest load on first use)
        self.interrupted = False

    # ------------------------------------------------------------------ set-up
    def _peer(self, method: str, spec: MethodSpec | None = None) -> LlamaCppPeer | LlamaServer:
        """The peer of a row (llama-server rows: one process per row, its own options)."""
        key = spec.label if spec is not None else method
        if key in self.peers:
            return self.peers[key]
        cfg = self.config
        if method in SERVER_METHODS:
            if cfg.server_binary is None:
                raise ValueError(f"{method} needs a llama-server binary (RunConfig.server_binary)")
            needs_draft = SERVER_CONFIGS[method][1]
            server = LlamaServer(method, cfg.server_binary, self.target_path,
                                 draft=self.draft_path if needs_draft else None, n_ctx=cfg.server_ctx,
                                 n_threads=cfg.threads, no_repack=cfg.no_repack, flash_attn=cfg.flash_attn,
                                 rpc=self._next_rpc(),
                                 options=spec.server_options if spec is not None else ())
            self.peers[key] = server  # registered first: close() stops it whatever start() does
            server.start()
            return server
        draft = self.draft_path if method == "llama-cpp-draft" else None
        self.peers[method] = LlamaCppPeer(method, self.target_path, draft=draft,
                                          lookup=method == "llama-cpp-lookup", n_ctx=self.peer_ctx,
                                          n_threads=cfg.threads, flash_attn=cfg.flash_attn == "on",
                                          num_pred_tokens=cfg.draft_len)
        return self.peers[method]

    def _next_rpc(self) -> tuple[str, ...]:
        """The rpc-server of the next llama-server row started (one each; none without RPC)."""
        started = sum(isinstance(p, LlamaServer) for p in self.peers.values())
        return (self.config.target_rpc[started],) if started < len(self.config.target_rpc) else ()

    def server_commands(self) -> dict[str, list[str]]:
        """The command line of every llama-server started, by row."""
        return {k: p.command for k, p in self.peers.items() if isinstance(p, LlamaServer)}

    def close(self) -> None:
        """Close every peer (llama-server processes stop here)."""
        for peer in self.peers.values():
            try:
                peer.close()
            except Exception as exc:  # noqa: BLE001 - close the others whatever one does
                log.warning("closing %s: %s", peer.name, exc)
        self.peers.clear()

    # ------------------------------------------------------------------ one run
    def _verifier(self, spec: MethodSpec, reference: list[int] | None) -> Verifier | None:
        if spec.base_method == "oracle":
            return Oracle(reference or [])
        if spec.verifier is None:
            return None  # the engine's
        if spec.verifier not in self.verifiers:
            e = self.engine
            self.verifiers[spec.verifier] = resolve_verifier(spec.verifier, e.pair, e.draft, e.target)
        return self.verifiers[spec.verifier]

    def _run_engine(self, spec: MethodSpec, prompt: list[int], reference: list[int] | None,
                    max_tokens: int, stop: tuple[str, ...] = (), seed: int = 0,
                    prediction: str | None = None, constraint: Constraint | None = None
                    ) -> tuple[list[int], str, Stats, list[Origin]]:
        verifier = self._verifier(spec, reference)
        threshold = 0.5 if spec.base_method == "oracle" else spec.threshold
        point = (OperatingPoint(threshold=threshold) if threshold is not None
                 else OperatingPoint(preset=spec.preset) if spec.preset else None)
        params = SamplingParams(max_tokens=max_tokens, temperature=self.config.temperature, stop=stop,
                                seed=self.config.seed + seed, prediction=prediction,
                                constraint=constraint)
        self.engine.reset_caches()  # every row pays its own prefill: comparable TTFT
        res = self.engine.generate(prompt, params, method=spec.engine_method, operating_point=point,
                                   verifier=verifier)
        return res.token_ids, res.text, res.stats, res.origins

    def run_one(self, spec: MethodSpec, prompt: list[int], reference: list[int] | None,
                max_tokens: int, stop: tuple[str, ...] = (), seed: int = 0, prediction: str | None = None,
                schema: dict | None = None
                ) -> tuple[list[int], str, Stats | None, list[Origin], dict, float, float]:
        """One row on one prompt; `schema`: the JSON schema its reply must follow (a structured
        prompt), sent to every row but a `+free` one."""
        memory.reset_peak()
        schema = None if spec.free else schema
        method = spec.base_method
        if method in SERVER_METHODS:
            server = self._peer(method, spec)
            run = server.generate(prompt, max_tokens, stop, self.config.temperature, self.config.seed + seed,
                                  json_schema=schema)
            return (run.tokens, run.text, None, [], server_stats(method, run), run.decode_seconds,
                    run.timed_tokens)
        if method in PEER_METHODS:
            r = self._peer(method).generate(prompt, max_tokens, stop, self.config.temperature,
                                            self.config.seed + seed)
            stats = {"method": method, "new_tokens": r.new_tokens, "prefill_seconds": r.prefill_seconds,
                     "decode_seconds": r.decode_seconds, "total_seconds": r.total_seconds,
                     "finish_reason": r.finish_reason,
                     "tokens_per_second": round(r.tokens_per_second, 3)}
            return (r.tokens, r.text, None, [], stats, r.decode_seconds,
                    max(r.new_tokens - 1, 0))
        constraint = _constraint(json.dumps(schema)) if schema is not None else None
        tokens, text, st, origins = self._run_engine(spec, prompt, reference, max_tokens, stop, seed,
                                                     prediction if spec.prediction else None, constraint)
        return tokens, text, st, origins, st.to_dict(), st.timings.decode_seconds, st.new_tokens

    # ------------------------------------------------------------------ the loop
    def run(self, prompts: Sequence[BenchPrompt],
            progress: Callable[[str], None] | None = None) -> list[RunRecord]:
        encoded = [self.engine.encode(p.text) for p in prompts]
        if encoded:  # the llama-cpp-python peers hold n_ctx x n_vocab logits: no more than needed
            need = max(map(len, encoded)) + self.config.max_tokens + 16
            self.peer_ctx = min(self.config.peer_ctx, -(-need // 256) * 256)
        if self.config.warmup and encoded:
            schema = structured.schema_of(prompts[0])  # a structured run compiles its grammar here
            for spec in self.specs:
                self.run_one(spec, encoded[0], None, 8, schema=schema)
            # the warmup's 8 tokens are no evidence (a reply's first tokens copy nothing): auto
            # starts the timed runs from its priors and this machine's costs
            self.engine.set_planner(None)
        records: list[RunRecord] = []
        others = [s for s in self.specs if not s.is_reference]
        ar_spec = next(s for s in self.specs if s.is_reference)
        try:
            for i, (bp, toks) in enumerate(zip(prompts, encoded, strict=True)):
                records += self._prompt(i, bp, toks, others, ar_spec, progress)
        except KeyboardInterrupt:  # keep the prompts that finished: a partial report
            log.warning("interrupted: reporting the %d runs of the prompts that finished", len(records))
            self.interrupted = True
        if any(p.workload == "humaneval" for p in prompts):
            by_id = {p.id: p for p in prompts}
            for rec in records:
                if rec.workload == "humaneval":
                    res = quality.check_humaneval(by_id[rec.prompt_id].problem, rec.text,
                                                  self.config.humaneval_timeout)
                    rec.humaneval = dataclasses.asdict(res)
        tasks = {p.id: p.problem for p in prompts if p.workload in edits.WORKLOADS}
        for rec in (r for r in records if r.prompt_id in tasks):  # checked after every timed run
            task = tasks[rec.prompt_id]
            check = edits.check_reply(task, rec.text, self.config.humaneval_timeout)
            if not check.passed and rec.stats.get("finish_reason") == "length":
                check.why += " (the reply ran out of --max-tokens)"  # a budget too small for the code
            rec.edit = dataclasses.asdict(check)
        shaped = {p.id: p.problem for p in prompts if p.workload == structured.WORKLOAD}
        for rec in (r for r in records if r.prompt_id in shaped):
            check = structured.check_reply(shaped[rec.prompt_id], rec.text, rec.stats.get("finish_reason"))
            rec.structured = dataclasses.asdict(check)
        return records

    def _prompt(self, i: int, bp: BenchPrompt, toks: list[int], others: list[MethodSpec],
                ar_spec: MethodSpec, progress: Callable[[str], None] | None) -> list[RunRecord]:
        """Every method on one prompt: ar first, the others in an order rotated by i."""
        records: list[RunRecord] = []
        k = i % len(others) if others else 0
        order = [ar_spec] + others[k:] + others[:k]
        schema = structured.schema_of(bp)
        if schema is not None:
            order = [s for s in order if s.base_method not in LLAMA_CPP_METHODS]  # they take no schema here
            # compiled before the rows, untimed: each finds it in the engine's cache, ar first as the rest
            compile_constraint(_constraint(json.dumps(schema)), self.engine.target)
        reference: list[int] | None = None
        ref_text = ""
        for spec in order:
            tokens, text, st, origins, sdict, dec_s, timed_tokens = self.run_one(
                spec, toks, reference, self.config.max_tokens, bp.stop, seed=i,
                prediction=edits.predicted_output(bp), schema=schema)
            rec = RunRecord(spec.label, bp.id, bp.workload, text, tokens, sdict,
                            len(tokens), dec_s, timed_tokens / dec_s if dec_s > 0 else 0.0,
                            memory.peak_rss_mib(), origins=origins, engine_stats=st)
            if spec.is_reference:
                reference, ref_text = tokens, text
            self._score(rec, spec, toks, reference, ref_text, st)
            records.append(rec)
            log.info("%s %s: %d tokens, %.2f tok/s", bp.id, spec.label, rec.new_tokens,
                     rec.tokens_per_second)
            if progress:
                progress(f"{bp.id} {spec.label}")
        return records

    def _score(self, rec: RunRecord, spec: MethodSpec, prompt: list[int], reference: list[int] | None,
               ref_text: str, st: Stats | None) -> None:
        if reference is not None:
            rec.rouge_l = quality.rouge_l(rec.text, ref_text)
            rec.exact_match, rec.prefix_agreement = quality.token_agreement(rec.tokens, reference)
        # tokens the target never saw (SPRINTER's, or auto's when it ran SPRINTER) need the
        # draft's distribution too, for the drift and false-pass columns
        unverified = any(o is Origin.KEPT for o in rec.origins)
        if self.config.rescore == "none" or (self.config.rescore == "verifier" and not unverified):
            return
        draft = self.engine.draft if unverified else None
        scores = quality.score_tokens(self.engine.target, prompt, rec.tokens, draft,
                                      SamplingParams(temperature=self.config.temperature))
        if scores is None:
            return
        rec.mean_logprob = float(scores.logprob.mean())
        rec.greedy_agreement = float(scores.greedy.mean())
        if st is not None and unverified:
            resampled = st.counters.resampled
            rec.false_pass = dataclasses.asdict(quality.false_pass(rec.origins, scores, resampled))
