"""bench_decode.py --dry-run: every variant's models built as the timed run builds them, checked without a GPU.

- each format's weight sets made as the timed run makes them (their time printed), one set's bytes against the
  memory floor's count;
- every variant's chains of 2 and 4 blocks through onnx.checker (full check: hcfuse registers both ops' schemas);
- the stock-int4 chain: per block two com.microsoft.MatMulNBits reading the fused node's own B and scales with
  the quantizer's attributes, and hcfuse.optimize fusing it back into the same nodes;
- fused against stock chains of 2 blocks on onnxruntime's CPU provider (float16 and float32: the CPU provider
  has no bfloat16 MatMul), both formats, the int4 pair at accuracy_level 4 as built (onnxruntime's CPU
  MatMulNBits then quantizes its activations to int8) and at 0 (fp32 activations, as the fused op).
"""

from __future__ import annotations

import numpy as np
import onnx

from decode_chains import C, DTYPES, H, K, NBITS_ATTRS, R, WEIGHT_SETS, chain_model, sublayer_weights, \
    variant_format, variant_model, weight_bytes, weight_sets  # first: puts the repository on sys.path
import hcfuse
from hcfuse import _op_nbits

BLOCKS = (2, 4)
CPU_DTYPES = ("fp16", "fp32")
ROWS = 3
# max |fused - stock| / max |stock| per output on CPU, 2 blocks: fp32 activations (dense, int4 at accuracy_level 0)
# differ by a few ulps of 16-bit outputs (measured <= 0.1%); int8 activations (int4 at level 4) by more (<= 0.2%)
FP_ACTIVATIONS_BOUND = 5e-3
INT8_ACTIVATIONS_BOUND = 2e-2


def check_unfused_int4(fused: onnx.ModelProto, stock: onnx.ModelProto, num_blocks: int) -> None:
    """stock (hcfuse.unfuse of fused) holds per block the two MatMulNBits the quantizer writes, on the fused
    node's own initializers, and fuses back into fused's nodes."""
    expected = []
    for node in fused.graph.node:
        if node.op_type == _op_nbits.OP_TYPE:
            ins = list(node.input)
            expected += [(ins[_op_nbits.DOWN_INJECT_WEIGHT], ins[_op_nbits.DOWN_INJECT_SCALES], K, R + C),
                         (ins[_op_nbits.UP_WEIGHT], ins[_op_nbits.UP_SCALES], R, K)]
    found = []
    for node in stock.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            want = {**NBITS_ATTRS}
            if node.domain != "com.microsoft" or len(node.input) != 3 or \
                    {k: attrs.get(k) for k in want} != want:
                raise SystemExit(f"dry run: stock-int4 node {node.name} is not the quantizer's MatMulNBits: "
                                 f"domain {node.domain}, inputs {list(node.input)}, attributes {attrs}")
            found.append((node.input[1], node.input[2], attrs["K"], attrs["N"]))
    if found != expected or len(found) != 2 * num_blocks:
        raise SystemExit(f"dry run: stock-int4 of {num_blocks} blocks holds MatMulNBits {found}; expected {expected}")
    others = {n.op_type for n in stock.graph.node} - {"BranchwiseRMSNorm", "HyperConnectionPostMix", "Split",
                                                      "ScaledSiLU", "Sigmoid", "HyperConnectionPreMix", "Div", "Mul",
                                                      "Identity", "MatMulNBits", "MatMul"}
    dense_products = [n.name for n in stock.graph.node if n.op_type == "MatMul" and not n.name.startswith("sublayer")]
    if others or dense_products:
        raise SystemExit(f"dry run: stock-int4 holds unexpected nodes: {sorted(others)} {dense_products}")
    refused = hcfuse.optimize(stock)
    again = [n for n in refused.graph.node if n.op_type == _op_nbits.OP_TYPE]
    if [list(n.input)[2:8] for n in again] != [list(n.input)[2:8] for n in fused.graph.node
                                               if n.op_type == _op_nbits.OP_TYPE]:
        raise SystemExit(f"dry run: hcfuse.optimize of stock-int4 gave {len(again)} fused nodes on other weights; "
                         f"expected {num_blocks} on the fused chain's")


def with_accuracy_level(model: onnx.ModelProto, level: int) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "accuracy_level":
                attr.i = level
    return out


def cpu_outputs(ort, model: onnx.ModelProto, streams: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.register_custom_ops_library(hcfuse.get_library_path())
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [o.astype(np.float32) for o in sess.run(None, {"streams": streams})]


def compare_on_cpu(ort, fused: onnx.ModelProto, stock: onnx.ModelProto, label: str, bound: float,
                   streams: np.ndarray) -> None:
    got, want = cpu_outputs(ort, fused, streams), cpu_outputs(ort, stock, streams)
    errors = [float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want)]
    status = "ok" if all(e <= bound for e in errors) and all(np.isfinite(g).all() for g in got) else "FAILED"
    print(f"  CPU, 2 blocks, {ROWS} rows, {label}: max |fused - stock| / max |stock| per output "
          f"{', '.join(f'{e:.1e}' for e in errors)} (bound {bound:g}): {status}")
    if status != "ok":
        raise SystemExit(f"dry run: {label} fused and stock chains differ beyond {bound:g}")


def dry_run(dtypes: list[str], variants: list[str], sublayer: bool, set_counts: dict[str, int]) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(6)
    all_variants = [*variants, "matmul"] if sublayer else list(variants)
    formats = sorted({variant_format(v) for v in all_variants if v != "matmul"})
    for dt in dtypes:
        dtype, elem = DTYPES[dt]
        itemsize = np.dtype(dtype).itemsize
        sublayers = sublayer_weights(dtype, rng, WEIGHT_SETS["dense"]) if sublayer else None
        fused = {}
        for fmt in formats:
            sets = weight_sets(fmt, set_counts[fmt], dtype, rng)
            counted = sum(w.nbytes for w in sets[0].values())
            if counted != weight_bytes(fmt, itemsize):
                raise SystemExit(f"dry run: a {dt} {fmt} weight set holds {counted} bytes; the floor counts "
                                 f"{weight_bytes(fmt, itemsize)}")
            fused.update({(fmt, n): chain_model(n, elem, sets, sublayers) for n in BLOCKS})
        for variant in all_variants:
            fmt = variant_format(variant)
            for n in BLOCKS:
                model = variant_model(variant, fused.get((fmt, n)), elem, n, sublayers)
                onnx.checker.check_model(model, full_check=True)
                if variant == "stock-int4":
                    check_unfused_int4(fused[fmt, n], model, n)
            ops = sorted({f"{node.op_type}" for node in model.graph.node})
            print(f"{dt} {variant}: chains of {' and '.join(map(str, BLOCKS))} blocks valid ONNX; ops {', '.join(ops)}"
                  + ("; MatMulNBits as the quantizer writes them, fused back by hcfuse.optimize"
                     if variant == "stock-int4" else ""), flush=True)
        if dt not in CPU_DTYPES:
            print(f"{dt}: fused and stock chains not run (onnxruntime's CPU provider has no {dt} MatMul)")
            continue
        streams = rng.standard_normal((ROWS, C * H)).astype(dtype)
        for fmt in formats:
            stock = hcfuse.unfuse(fused[fmt, BLOCKS[0]])
            if fmt == "dense":
                compare_on_cpu(ort, fused[fmt, BLOCKS[0]], stock, f"{dt} dense", FP_ACTIVATIONS_BOUND, streams)
                continue
            compare_on_cpu(ort, fused[fmt, BLOCKS[0]], with_accuracy_level(stock, 0),
                           f"{dt} int4, MatMulNBits at accuracy_level 0", FP_ACTIVATIONS_BOUND, streams)
            compare_on_cpu(ort, fused[fmt, BLOCKS[0]], stock, f"{dt} int4 as built (accuracy_level 4)",
                           INT8_ACTIVATIONS_BOUND, streams)
    print("dry run: every model built and checked")
