"""Loading one GGUF model into llama.cpp for `LlamaModel` (llama.py): the model's parameters and
its load log (what llama.cpp repacked, where the layers went), then a context for it. A NULL
from llama.cpp becomes one error naming the file and llama.cpp's last complaint."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BackendError, ModelFileError
from . import native
from .native import llama_cpp

if TYPE_CHECKING:
    from .llama import LoadOptions

LogLines = list[tuple[int, str]]  # (level, line) of llama.cpp's log during a call


def load_model(path: Path, options: LoadOptions, devices: Any = None) -> tuple[Any, LogLines]:
    """llama.cpp's model from `path`, with its load log. `devices`: a NULL-terminated array of
    llama.cpp devices (rpc-servers, `rpc.Devices.pointer`) that then hold every layer, whatever
    the GPU layers asked (those are this machine's GPU's)."""
    params = llama_cpp.llama_model_default_params()
    # -1: every layer (llama.cpp reads any negative count as all of them, the output layer too)
    params.n_gpu_layers = options.n_gpu_layers
    if devices is not None:
        params.devices = devices
        params.n_gpu_layers = -1
    params.use_mmap = options.use_mmap
    if native.avoid_extra_buffers():
        # Native builds with AMX crash on the first decode on some Xeons.
        params.use_extra_bufts = False
    with native.capture_log() as logbuf:
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        detail = logbuf.last_error() or "llama.cpp could not load it"
        raise ModelFileError(f"cannot load model {path}: {detail} "
                             "(is the file complete? a truncated or corrupt GGUF fails here)")
    return model, logbuf.lines


def repacked(load_log: LogLines) -> bool:
    """Whether llama.cpp repacked a weight buffer as it loaded (its log is all that tells)."""
    return any("CPU_REPACK model buffer" in line for _, line in load_log)


def new_context(model: Any, path: Path, options: LoadOptions, n_ctx: int, flash_attn_type: int) -> Any:
    """A context of `n_ctx` tokens for `model` (one sequence, logits only until hidden states are
    asked for); BackendError where llama.cpp gives none."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = options.n_batch
    params.n_ubatch = options.n_batch
    params.n_seq_max = 1
    params.n_threads = options.threads()
    params.n_threads_batch = options.threads()
    params.embeddings = False  # switched on only for the decodes that need hidden states
    params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
    params.no_perf = True
    params.flash_attn_type = flash_attn_type
    with native.capture_log() as logbuf:
        ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise BackendError(f"cannot create a context for {path.name} (n_ctx={n_ctx}): "
                           f"{logbuf.last_error() or 'out of memory?'}")
    return ctx


def placement(gpu_layers: int, layers: int, devices: list[str], rpc: tuple[str, ...] = ()) -> str:
    """Where a model's layers are, in a few words: "31/31 layers on GPU (Metal)", "on the CPU"
    (`devices`: as the load log names them; `rpc`: the rpc-servers that hold them)."""
    if not gpu_layers:
        return "on the CPU"
    if rpc:
        where = "rpc-server " + ", ".join(rpc)
    else:
        where = "GPU (" + ", ".join(native.device_name(d) for d in devices) + ")"
    rest = ", the rest on the CPU" if gpu_layers < layers else ""
    return f"{gpu_layers}/{layers} layers on {where}{rest}"
