"""Make a draft model by keeping only the first K blocks of a GGUF model.

The result shares the tokenizer byte for byte but disagrees with the full model often,
which makes it a fast test fixture that forces speculative rejections (it is useless as a
real draft). Uses the `gguf` package's reader and writer.

    python tools/make_truncated_draft.py SOURCE.gguf OUT.gguf --blocks 6
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import gguf
import numpy as np


def truncate(source: Path, out: Path, blocks: int) -> None:
    reader = gguf.GGUFReader(source)
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    block_key = f"{arch}.block_count"
    n_blocks = int(reader.fields[block_key].parts[-1][0])
    if not 0 < blocks < n_blocks:
        raise SystemExit(f"--blocks must be between 1 and {n_blocks - 1}")

    partial = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(partial, arch=arch, endianess=reader.endianess)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture",):
            continue
        vtype = field.types[0]
        if name == block_key:
            writer.add_uint32(name, blocks)
        elif vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]) for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(name, vals) if sub != gguf.GGUFValueType.STRING else writer.add_key_value(
                name, vals, vtype, sub_type=sub)
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_key_value(name, bytes(field.parts[field.data[0]]), vtype)
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], vtype)

    pattern = re.compile(r"^blk\.(\d+)\.")
    for t in reader.tensors:
        m = pattern.match(t.name)
        if m and int(m.group(1)) >= blocks:
            continue
        # t.data is the on-disk layout (bytes for quantised types); the writer derives the shape.
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", type=Path, help="the full GGUF model")
    p.add_argument("out", type=Path, help="where to write the truncated model")
    p.add_argument("--blocks", type=int, default=6, help="transformer blocks to keep (default: 6)")
    args = p.parse_args(argv)
    truncate(args.source, args.out, args.blocks)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes, {args.blocks} blocks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
