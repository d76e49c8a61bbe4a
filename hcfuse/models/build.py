"""`python -m hcfuse.models.build OUT.onnx [options]`: writes a decode graph with the stock hyper-connection chain.

Example (the full-size 96-block bf16 model, ~2.5 GB of weights in OUT.onnx.data):
    python -m hcfuse.models.build qwen96.onnx --blocks 96 --dtype bfloat16

Weights go to OUT.onnx.data when they would not fit in one protobuf (--external-data auto), always
with --external-data, never with --external-data no (refused, with a line, for weights that cannot).
"""

from __future__ import annotations

import argparse
import sys

from hcfuse import _op
from hcfuse.files import model_io
from hcfuse.models.genai_model_folder import save_genai_model_folder
from hcfuse.models.qwen_decode import build_decode_model, save_decode_model
from hcfuse.reference import DTYPES_BY_NAME


def _dims(text: str) -> tuple:
    return tuple(int(d) if d.lstrip("-").isdigit() else d for d in text.split(",") if d)


_EXTERNAL_DATA = ("auto", "yes", "no")


def parse_args(argv=None) -> argparse.Namespace:
    q = _op.QWEN_CONFIG
    p = argparse.ArgumentParser(prog="python -m hcfuse.models.build", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("output", help="path of the .onnx file to write")
    p.add_argument("--blocks", type=int, default=q["num_blocks"], help="hyper-connection blocks")
    p.add_argument("--branches", "-C", type=int, default=q["num_branches"], dest="C", help="streams (C)")
    p.add_argument("--hidden", "-H", type=int, default=q["hidden"], dest="H", help="hidden size per stream (H)")
    p.add_argument("--rank", "-R", type=int, default=q["rank"], dest="R", help="low rank (R)")
    p.add_argument("--dtype", choices=sorted(DTYPES_BY_NAME), default="bfloat16", help="weights and activations")
    p.add_argument("--separate", action="store_true", help="separate down/inject MatMuls instead of the packed one")
    p.add_argument("--leading-dims", type=_dims, default="batch,seq", help="comma list, e.g. batch,seq or 1,1")
    p.add_argument("--sublayer", choices=("matmul", "identity"), default="matmul",
                   help="the stand-in for attention / MoE between blocks")
    p.add_argument("--final-mix", action="store_true", help="append the final mix without the inject half")
    p.add_argument("--weight-sets", type=int, default=None,
                   help="blocks cycle through this many weight sets (by default each block has its own)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated weights")
    p.add_argument("--external-data", nargs="?", choices=_EXTERNAL_DATA, const="yes", default="auto",
                   help="weights in OUTPUT.data next to the model: auto (when over "
                        f"{model_io.INLINE_LIMIT_BYTES / 1e9:.1f} GB, which one protobuf cannot hold), yes "
                        "(the flag alone), no")
    p.add_argument("--genai-folder", action="store_true",
                   help="OUTPUT is a folder: write an onnxruntime-genai model folder (model.onnx, model.onnx.data, "
                        "genai_config.json, tokenizer files) shaped like its model builder's")
    return p.parse_args(argv)


def decode_options(a: argparse.Namespace) -> dict:
    """The decode model's options (save_decode_model's keywords) from the parsed command line."""
    return dict(C=a.C, H=a.H, R=a.R, dtype=DTYPES_BY_NAME[a.dtype], packed=not a.separate,
                leading_dims=a.leading_dims, sublayer=a.sublayer, final_mix=a.final_mix,
                num_weight_sets=a.weight_sets, seed=a.seed, **_op.QWEN_ATTRIBUTES)


def external_data(choice: str, blocks: int, options: dict) -> bool:
    """Whether the weights go to OUTPUT.data; ValueError for inline weights that protobuf cannot hold."""
    size = model_io.initializer_bytes(build_decode_model(blocks, **options))  # lazy weights: sized, not made
    if choice == "no" and size > model_io.INLINE_LIMIT_BYTES:
        raise ValueError(f"--external-data no: the weights are {size / 1e9:.2f} GB, more than one protobuf "
                         f"holds ({model_io.INLINE_LIMIT_BYTES / 1e9:.1f} GB); leave it out or pass --external-data")
    return choice == "yes" or (choice == "auto" and size > model_io.INLINE_LIMIT_BYTES)


def main(argv=None) -> int:
    a = parse_args(argv)
    options = decode_options(a)
    try:
        if a.genai_folder:
            save_genai_model_folder(a.output, a.blocks, **options)
            where = ""
        else:
            external = external_data(a.external_data, a.blocks, options)
            save_decode_model(a.output, a.blocks, external_data=external, **options)
            where = f", weights in {model_io.data_file_name(a.output)}" if external else ""
    except (ValueError, OSError) as e:
        print(f"hcfuse.models.build: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.output}: {a.blocks} blocks, C={a.C} H={a.H} R={a.R} {a.dtype}{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
