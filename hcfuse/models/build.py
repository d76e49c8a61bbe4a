"""`python -m hcfuse.models.build OUT.onnx [options]`: writes a decode graph with the stock hyper-connection chain.

Example (the full-size 96-block bf16 model, ~2.5 GB of weights in OUT.onnx.data):
    python -m hcfuse.models.build qwen96.onnx --blocks 96 --dtype bfloat16 --external-data
"""

from __future__ import annotations

import argparse
import sys

from hcfuse import _op
from hcfuse.models.genai_model_folder import save_genai_model_folder
from hcfuse.models.qwen_decode import save_decode_model
from hcfuse.reference import DTYPES_BY_NAME


def _dims(text: str) -> tuple:
    return tuple(int(d) if d.lstrip("-").isdigit() else d for d in text.split(",") if d)


def parse_args(argv=None) -> argparse.Namespace:
    q = _op.QWEN_CONFIG
    p = argparse.ArgumentParser(prog="python -m hcfuse.models.build", description=__doc__.splitlines()[0])
    p.add_argument("output", help="path of the .onnx file to write")
    p.add_argument("--blocks", type=int, default=q["num_blocks"], help="hyper-connection blocks (default %(default)s)")
    p.add_argument("--branches", "-C", type=int, default=q["num_branches"], dest="C")
    p.add_argument("--hidden", "-H", type=int, default=q["hidden"], dest="H")
    p.add_argument("--rank", "-R", type=int, default=q["rank"], dest="R")
    p.add_argument("--dtype", choices=sorted(DTYPES_BY_NAME), default="bfloat16")
    p.add_argument("--separate", action="store_true", help="separate down/inject MatMuls instead of the packed one")
    p.add_argument("--leading-dims", type=_dims, default=("batch", "seq"), help="comma list, e.g. batch,seq or 1,1")
    p.add_argument("--sublayer", choices=("matmul", "identity"), default="matmul")
    p.add_argument("--final-mix", action="store_true", help="append the final mix without the inject half")
    p.add_argument("--weight-sets", type=int, default=None, help="blocks cycle through this many weight sets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--external-data", action="store_true", help="weights in OUTPUT.data next to the model")
    p.add_argument("--genai-folder", action="store_true",
                   help="OUTPUT is a folder: write an onnxruntime-genai model folder (model.onnx, model.onnx.data, "
                        "genai_config.json, tokenizer files) shaped like its model builder's")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    options = dict(C=a.C, H=a.H, R=a.R, dtype=DTYPES_BY_NAME[a.dtype], packed=not a.separate,
                   leading_dims=a.leading_dims, sublayer=a.sublayer, final_mix=a.final_mix,
                   num_weight_sets=a.weight_sets, seed=a.seed, **_op.QWEN_ATTRIBUTES)
    try:
        if a.genai_folder:
            save_genai_model_folder(a.output, a.blocks, **options)
        else:
            save_decode_model(a.output, a.blocks, external_data=a.external_data, **options)
    except (ValueError, OSError) as e:
        print(f"hcfuse.models.build: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.output}: {a.blocks} blocks, C={a.C} H={a.H} R={a.R} {a.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
