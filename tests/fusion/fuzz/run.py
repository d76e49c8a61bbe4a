"""Makes mutant i of seed s, checks that onnxruntime runs it, fuses it and compares both in onnxruntime.

A mutant passes when hcfuse.optimize_with_report raises nothing, the optimized model is a valid model
that onnxruntime runs on the same feeds (overridable initializers fed with other values than their
defaults), and every output of the original agrees within hcfuse.checking.verification's ulp bound of T
(default_max_ulp: the int8-activation bound where a fused quantized block's MatMulNBits had accuracy_level 4); a
block the pass left unfused is fine (the reasons are counted). Anything else is a finding.

Three in ten mutants also have their main graph's nodes shuffled (node_order, after every other mutation):
such a mutant must fuse as the same mutant unshuffled does (same blocks, same reasons), and a model
where nothing fused must come back in its own node order.

bfloat16: onnxruntime's CPU provider has no bfloat16 MatMul/Sigmoid/Div/Mul, so the stock chain cannot
run there and bfloat16 mutants are not part of the differential run (bases.DTYPES).

    python -m tests.fusion.fuzz.run --count 300 --seed 0        # the summary, as the test prints it
    python -m tests.fusion.fuzz.run --seed 0 --index 17 --save out/  # one mutant: what it is, what happened
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
import time

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from hcfuse import _op
from hcfuse.checking.verification import DEFAULT_MAX_ULP, default_max_ulp, ulp_gap
from tests.fusion.fuzz.bases import CONTRIB, QUANTIZED, Base, build, quantized_unfusable, random_base, random_form
from tests.fusion.fuzz import nbits, node_order
from tests.fusion.fuzz.mutations import MUTATIONS, Context

# mutations per mutant: mostly one, some none (the valid base: every block must fuse), some several
_MUTATION_COUNTS = (0, 1, 1, 1, 1, 2, 2, 3)
# finding kinds (Outcome.status other than "ok" / "discarded")
FINDINGS = ("raised", "invalid_model", "ort_error", "mismatch", "missed_base", "report_gap", "dtype_dependent",
            "reordered", "order_dependent")
KINDS = (*MUTATIONS, node_order.KIND)  # what exclude and --only name
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
BFLOAT16_SHARE = 0.1
NBITS_SHARE = 0.5  # of a quantized mutant's mutations: those of its MatMulNBits (the other kinds barely reach them)


@dataclasses.dataclass
class Mutant:
    seed: int
    index: int
    base: Base
    labels: list[str]
    model: onnx.ModelProto
    feeds: dict  # values of the graph inputs the mutations added
    input_shapes: dict  # name -> concrete shape of the base's graph inputs (a mutation may drop a shape)
    weight_inputs: frozenset  # the base's weights fed as graph inputs
    twin: Mutant | None = None  # a bfloat16 mutant's float32 twin
    unshuffled: onnx.ModelProto | None = None  # a shuffled mutant before its shuffle

    @property
    def kinds(self) -> list[str]:
        return [label.split(":", 1)[0] for label in self.labels] or ["none"]

    @property
    def mutated(self) -> bool:
        """Whether a mutation changed what the model computes or how (a shuffle changes neither)."""
        return any(not label.startswith(node_order.KIND) for label in self.labels)

    def describe(self) -> str:
        return f"seed {self.seed} index {self.index}: {self.base.describe()}; mutations {self.labels or ['none']}"


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    status: str  # "ok", "discarded" or one of FINDINGS
    detail: str = ""
    blocks: int = 0
    fused: int = 0
    rejections: list[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        return f"[{self.status}] {self.mutant.describe()}\n    {self.detail}"


def make_mutant(seed: int, index: int, exclude: tuple = (), dtype=None) -> Mutant:
    """Mutant `index` of `seed` (the same model every time); exclude: mutation kinds never applied
    (node_order.KIND among them: never shuffled).

    BFLOAT16_SHARE of the mutants are bfloat16, with a float32 twin: the same mutant in float32 (the
    mutations draw the same random numbers whatever the type)."""
    rng = np.random.default_rng([seed, index])
    base = random_form(random_base(rng), np.random.default_rng([seed, index, 5]))
    twin = None
    if dtype is None and np.random.default_rng([seed, index, 3]).random() < BFLOAT16_SHARE:
        twin, dtype = make_mutant(seed, index, exclude, dtype=np.float32), BFLOAT16
    if dtype is not None:
        base = dataclasses.replace(base, dtype=dtype)
    model = build(base)
    sizes = dict(zip(base.leading_dims, base.lead))
    shapes = {v.name: tuple(sizes.get(d.value, d) if isinstance(d, ir.SymbolicDim) else d for d in v.shape)
              for v in model.graph.inputs}
    weights = frozenset(v.name for v in model.graph.inputs if all(isinstance(d, int) for d in v.shape)
                        and len(v.shape) == 2 and v.name not in ("inputs_embeds", "hyper_states"))
    ctx = Context(base, rng)
    wanted = int(rng.choice(_MUTATION_COUNTS))
    labels, kinds = [], [k for k in MUTATIONS if k not in exclude]
    for _ in range(8 * wanted if kinds else 0):
        if len(labels) == wanted:
            break
        kind = kinds[int(rng.integers(len(kinds)))]
        if base.form == QUANTIZED and nbits.KIND in kinds and rng.random() < NBITS_SHARE:
            kind = nbits.KIND
        try:
            label = MUTATIONS[kind](model, ctx)
        except Exception as e:  # a defect of the fuzz itself: say which mutant, after which mutations
            raise RuntimeError(f"fuzz: mutation {kind} failed on seed {seed} index {index} after {labels}") from e
        if label:
            labels.append(label)
    proto = ir.to_proto(model)
    for fn, args in ctx.late:
        fn(proto, *args)
    unshuffled = None
    order_rng = np.random.default_rng([seed, index, 4])  # its own: the other mutations stay as they were
    if node_order.KIND not in exclude and order_rng.random() < node_order.SHARE:
        unshuffled = onnx.ModelProto()
        unshuffled.CopyFrom(proto)
        label = node_order.shuffle_order(proto, order_rng)
        labels, unshuffled = (labels + [label], unshuffled) if label else (labels, None)
    return Mutant(seed, index, base, labels, proto, ctx.feeds, shapes, weights, twin, unshuffled)


def _feeds(mutant: Mutant, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every graph input: the mutation's value, an overridable initializer's default perturbed (integer
    ones, Split sizes, keep theirs: other sizes would not run), or unit-scale random data."""
    graph = mutant.model.graph
    inits = {t.name: t for t in graph.initializer}
    np_T = np.dtype(mutant.base.dtype)
    feeds = {}
    for value in graph.input:
        name = value.name
        if name in mutant.feeds:
            feeds[name] = mutant.feeds[name]
        elif name in inits:
            default = onnx.numpy_helper.to_array(inits[name])
            if default.dtype.kind == "f":
                default = np.asarray(default * rng.uniform(0.5, 1.5, default.shape)).astype(default.dtype)
            feeds[name] = default
        else:
            shape = mutant.input_shapes[name]
            if name.endswith("hc_norm.weight"):
                data = 1.0 + 0.1 * rng.standard_normal(shape)
            elif name == "token_mask":  # mobius's: which tokens are real
                feeds[name] = rng.random(shape) < 0.8
                continue
            elif name == "prev_post_gate":
                data = rng.uniform(0.0, 2.0, shape)
            elif name in mutant.weight_inputs:
                data = rng.standard_normal(shape) / np.sqrt(shape[0])
            else:
                data = rng.standard_normal(shape)
            feeds[name] = data.astype(np_T)
    return feeds


def session_options(library: str) -> ort.SessionOptions:
    """One SessionOptions for every session of a run (registering the library costs ~0.1 s a time):
    the library registered, graph optimizations off (ORT runs exactly the nodes built), one thread."""
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    return options


def _first_line(error: Exception) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def _run(model: onnx.ModelProto, feeds: dict, options: ort.SessionOptions) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


_NORMS = {_op.BRANCH_NORM, "SimplifiedLayerNormalization", "Reciprocal"}  # one a block: contrib, GenAI, mobius


def check_model(model: onnx.ModelProto, *, sorted_nodes: bool = False) -> None:
    """onnx.checker on what onnxruntime runs: a main graph in any node order (onnxruntime sorts it;
    sorted_nodes demands it sorted) and onnxruntime's own ops in the default domain
    (SimplifiedLayerNormalization), which ONNX does not know, checked as custom ops."""
    if not sorted_nodes:
        model = node_order.in_checker_order(model)
    ort_only = [n for g in _graphs(model) for n in g.node if n.domain in ("", "ai.onnx")
                and not onnx.defs.has(n.op_type)]
    if ort_only:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        for node in (n for g in _graphs(copy) for n in g.node if n.domain in ("", "ai.onnx")):
            if not onnx.defs.has(node.op_type):
                node.domain = _op.DOMAIN
        model = copy
    onnx.checker.check_model(model)


def _graphs(model: onnx.ModelProto) -> list:
    """The main graph, the functions and every subgraph of either (anything with a .node list)."""
    out, todo = [], [model.graph, *model.functions]
    while todo:
        graph = todo.pop()
        out.append(graph)
        for node in graph.node:
            for attr in node.attribute:
                todo += [*([attr.g] if attr.HasField("g") else []), *attr.graphs]
    return out


def count_blocks(model: onnx.ModelProto) -> int:
    """Block norms in the graph, its subgraphs and the model-local functions."""
    def in_nodes(nodes) -> int:
        count = 0
        for node in nodes:
            count += node.op_type in _NORMS
            for attr in node.attribute:
                count += sum(in_nodes(g.node) for g in [*([attr.g] if attr.HasField("g") else []), *attr.graphs])
        return count

    return in_nodes(model.graph.node) + sum(in_nodes(f.node) for f in model.functions)


def check(mutant: Mutant, options: ort.SessionOptions) -> Outcome:
    """The differential check of one mutant (see the module doc)."""
    if mutant.twin is not None:
        return _check_bfloat16(mutant, options)
    try:
        check_model(mutant.model)
        feeds = _feeds(mutant, np.random.default_rng([mutant.seed, mutant.index, 1]))
        expected = _run(mutant.model, feeds, options)
    except Exception as e:  # noqa: BLE001 - whatever makes the mutant unrunnable discards it
        return Outcome(mutant, "discarded", _first_line(e))
    blocks = count_blocks(mutant.model)
    try:
        optimized, report = _optimize(mutant.model)
    except Exception as e:  # noqa: BLE001 - the pass must never raise on a model onnxruntime runs
        return Outcome(mutant, "raised", _first_line(e), blocks)
    out = Outcome(mutant, "ok", "", blocks, len(report.fused), [item.reason for item in report.rejected])
    problem = _structure_problem(mutant, optimized, out)
    if problem:
        return problem
    lost = [name for name in feeds if name not in {v.name for v in optimized.graph.input}]
    if lost:
        return dataclasses.replace(out, status="invalid_model", detail=f"graph inputs {lost} are gone")
    try:
        actual = _run(optimized, feeds, options)
    except Exception as e:  # noqa: BLE001
        return dataclasses.replace(out, status="ort_error", detail=_first_line(e))
    bounds = default_max_ulp(ir.from_proto(optimized), "CPUExecutionProvider")[0] if out.fused else DEFAULT_MAX_ULP
    problem = _output_gap(expected, actual, bounds)
    if problem is None and bounds != DEFAULT_MAX_ULP:
        # the int8-activation bound hides a wrong weight (a sign-flipped scale moves the outputs by a third of
        # their scale): both models with fp32 activations (every MatMulNBits, the unfused ones too, at
        # accuracy_level 0) must also agree at the dense bounds
        try:
            dense = [_run(_accuracy_level_0(m), feeds, options) for m in (mutant.model, optimized)]
        except Exception as e:  # noqa: BLE001
            return dataclasses.replace(out, status="ort_error", detail=f"at accuracy_level 0: {_first_line(e)}")
        problem = _output_gap(*dense, DEFAULT_MAX_ULP)
        problem = problem and f"both at accuracy_level 0: {problem}"
    if problem:
        return dataclasses.replace(out, status="mismatch", detail=f"{problem}; fused {out.fused}")
    fusable = fusable_blocks(mutant, blocks)
    if not mutant.mutated and out.fused != fusable and not _packed_weight_inputs(mutant.base):
        return dataclasses.replace(out, status="missed_base", detail=f"unmutated base: {out.fused} of {blocks} "
                                                                     f"blocks fused ({fusable} fusable); {out.rejections}")
    left = [r for r in out.rejections if " not fused: " not in r]  # "prologue not fused: ...": a fused block
    if mutant.base.form not in (CONTRIB, QUANTIZED):  # a block in standard ONNX is several candidates, each with its reason
        if out.fused < blocks and not left:
            return dataclasses.replace(out, status="report_gap", detail=f"{blocks - out.fused} of {blocks} blocks "
                                                                        f"left unfused without a reason")
    elif len(left) != blocks - out.fused:
        return dataclasses.replace(out, status="report_gap", detail=f"{blocks - out.fused} of {blocks} blocks left "
                                                                    f"unfused, {len(left)} rejections: {left}")
    return out


def _check_bfloat16(mutant: Mutant, options: ort.SessionOptions) -> Outcome:
    """The float32 twin gets the differential check; the bfloat16 mutant, which onnxruntime's CPU cannot
    run, must then fuse the same blocks for the same reasons (where the mutations are the same: a
    Constant with value_float exists in float32 only), raise nothing and give a valid model."""
    twin = check(mutant.twin, options)
    if twin.status != "ok":
        detail = twin.detail if twin.status == "discarded" else f"float32 twin: {twin.detail}"
        return dataclasses.replace(twin, mutant=mutant, detail=detail)
    try:
        check_model(mutant.model)
    except Exception as e:  # noqa: BLE001
        return Outcome(mutant, "discarded", _first_line(e))
    blocks = count_blocks(mutant.model)
    try:
        optimized, report = _optimize(mutant.model)
    except Exception as e:  # noqa: BLE001
        return Outcome(mutant, "raised", _first_line(e), blocks)
    out = Outcome(mutant, "ok", "bfloat16: the pass only", blocks, len(report.fused),
                  [item.reason for item in report.rejected])
    problem = _structure_problem(mutant, optimized, out)
    if problem:
        return problem
    decisions = (out.fused, sorted(map(reason_class, out.rejections)))
    if mutant.labels == mutant.twin.labels and decisions != (twin.fused, sorted(map(reason_class, twin.rejections))):
        return dataclasses.replace(out, status="dtype_dependent", detail=f"bfloat16 {decisions}, float32 twin "
                                                                         f"{(twin.fused, twin.rejections)}")
    return out


def _structure_problem(mutant: Mutant, optimized: onnx.ModelProto, out: Outcome) -> Outcome | None:
    """A finding about the optimized model as a model: onnx.checker refuses it (sorted nodes demanded
    where a block fused; the caller's order, checked sorted, where none did), nothing fused but the nodes
    moved, or a shuffled mutant fused otherwise than the same mutant unshuffled."""
    if not out.fused and node_order.node_order(optimized) != node_order.node_order(mutant.model):
        return dataclasses.replace(out, status="reordered", detail="nothing fused, but the nodes are not in the "
                                                                   "input's order")
    try:
        check_model(optimized, sorted_nodes=bool(out.fused))
    except Exception as e:  # noqa: BLE001
        return dataclasses.replace(out, status="invalid_model", detail=_first_line(e))
    if mutant.unshuffled is not None:
        try:
            _, report = _optimize(mutant.unshuffled)
        except Exception as e:  # noqa: BLE001
            return dataclasses.replace(out, status="order_dependent", detail=f"unshuffled: {_first_line(e)}")
        sorted_decisions = (len(report.fused), sorted(reason_class(item.reason) for item in report.rejected))
        if sorted_decisions != (out.fused, sorted(map(reason_class, out.rejections))):
            return dataclasses.replace(out, status="order_dependent", detail=f"shuffled {out.fused} fused "
                                       f"{out.rejections}; unshuffled {sorted_decisions}")
    return None


def _output_gap(expected: dict, actual: dict, bounds: dict) -> str | None:
    """The first output of actual that is missing, of another shape or type, or beyond bounds (ulp by type)."""
    for name, a in expected.items():
        b = actual.get(name)
        if b is None or b.shape != a.shape or b.dtype != a.dtype:
            found = "missing" if b is None else f"{b.dtype}{list(b.shape)}"
            return f"output {name!r} {a.dtype}{list(a.shape)}: optimized gives {found}"
        dtype = ir.DataType.from_numpy(a.dtype)
        gap = ulp_gap(a, b, dtype) if dtype in bounds else float(0 if np.array_equal(a, b) else np.inf)
        bound = bounds.get(dtype, 0.0)
        if not gap <= bound:
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
            return f"output {name!r}: {gap:g} ulp > {bound:g} (max abs diff {diff:.3g})"
    return None


def _accuracy_level_0(model: onnx.ModelProto) -> onnx.ModelProto:
    """model with every MatMulNBits at accuracy_level 0 (fp32 activations on onnxruntime's CPU)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for graph in _graphs(copy):
        for node in graph.node:
            if node.op_type == "MatMulNBits":
                for attr in node.attribute:
                    if attr.name == "accuracy_level":
                        attr.i = 0
    return copy


def fusable_blocks(mutant: Mutant, blocks: int) -> int:
    """Of an unmutated base's blocks, those the pass must fuse: all but the quantized form's blocks that
    docs/QUANTIZED.md leaves unfused (bases.quantized_unfusable)."""
    return blocks - (quantized_unfusable(mutant.model) if mutant.base.form == QUANTIZED else 0)


def _packed_weight_inputs(base: Base) -> bool:
    """A packed weight fed as a graph input: the pass leaves such blocks unfused (it cannot split it)."""
    return base.packed and base.options.get("weights_as_inputs", False)


def _optimize(model: onnx.ModelProto):
    import hcfuse

    return hcfuse.optimize_with_report(model)


def reason_class(reason: str) -> str:
    """A rejection reason without its node/value names, numbers and element types: what the summary counts."""
    text = re.sub(r"'[^']*'", "'…'", reason)
    text = re.sub(r"\(at [^)]*\)", "", text)
    text = re.sub(r"\b(BFLOAT16|FLOAT16|FLOAT)\b", "T", text)  # the element type a message names
    text = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "N", text)
    return text.strip()[:110]


@dataclasses.dataclass
class Summary:
    seed: int
    outcomes: list[Outcome]
    seconds: float

    def findings(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in FINDINGS]

    def ran(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != "discarded"]

    def text(self) -> str:
        ran, findings = self.ran(), self.findings()
        blocks = sum(o.blocks for o in ran)
        fused = sum(o.fused for o in ran)
        lines = [
            f"fusion fuzz, seed {self.seed}: {len(self.outcomes)} mutants made, {len(ran)} ran in onnxruntime "
            f"({len(self.outcomes) - len(ran)} discarded: onnxruntime cannot run them), {len(findings)} findings, "
            f"{self.seconds:.1f} s",
            f"  blocks in the mutants that ran: {blocks}; fused: {fused}; "
            f"mutants with every block fused: {sum(o.blocks == o.fused for o in ran if o.status == 'ok')}, "
            f"with some block unfused: {sum(o.fused < o.blocks for o in ran if o.status == 'ok')}",
        ]
        by_kind = collections.defaultdict(collections.Counter)
        for o in self.outcomes:
            for kind in dict.fromkeys(o.mutant.kinds):
                by_kind[kind][o.status] += 1
        bf16 = [o for o in ran if o.mutant.twin is not None]
        lines.append(f"  of those, bfloat16: {len(bf16)} (the pass only: their float32 twins ran the differential "
                     f"check; same fusions and reasons required)")
        lines.append("  by mutation kind (status: count):")
        for kind in sorted(by_kind):
            lines.append(f"    {kind:18s} " + ", ".join(f"{s} {n}" for s, n in sorted(by_kind[kind].items())))
        reasons = collections.Counter(reason_class(r) for o in ran for r in o.rejections)
        lines.append(f"  unfused (or partly fused) blocks by reason: {sum(reasons.values())}")
        lines += [f"    {n:5d}  {r}" for r, n in reasons.most_common()]
        discards = collections.Counter(reason_class(o.detail)[:80] for o in self.outcomes if o.status == "discarded")
        lines.append("  discarded, most common onnxruntime errors:")
        lines += [f"    {n:5d}  {r}" for r, n in discards.most_common(6)]
        if findings:
            lines.append("  findings:")
            lines += ["    " + o.describe().replace("\n", "\n    ") for o in findings]
        return "\n".join(lines)


def run_fuzz(count: int, seed: int, library: str, *, exclude: tuple = (), progress=None) -> Summary:
    start = time.perf_counter()
    options = session_options(library)
    outcomes = []
    for index in range(count):
        outcomes.append(check(make_mutant(seed, index, exclude), options))
        if progress:
            progress(outcomes[-1])
    return Summary(seed, outcomes, time.perf_counter() - start)


def main(argv=None) -> int:
    import hcfuse

    p = argparse.ArgumentParser(prog="python -m tests.fusion.fuzz.run", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--exclude", default="", help="comma list of mutation kinds never applied")
    p.add_argument("--only", default="", help="comma list of the only mutation kinds applied")
    p.add_argument("--index", type=int, default=None, help="check only this mutant and describe it")
    p.add_argument("--save", default=None, help="with --index: write the mutant (and its fused form) here")
    a = p.parse_args(argv)
    exclude = tuple(k for k in KINDS if k in a.exclude.split(",") or a.only and k not in a.only.split(","))
    library = hcfuse.get_library_path()
    if a.index is None:
        summary = run_fuzz(a.count, a.seed, library, exclude=exclude)
        print(summary.text())
        return 1 if summary.findings() else 0
    mutant = make_mutant(a.seed, a.index, exclude)
    outcome = check(mutant, session_options(library))
    print(outcome.describe())
    print(f"    blocks {outcome.blocks}, fused {outcome.fused}, rejections {outcome.rejections}")
    if a.save:
        import os

        os.makedirs(a.save, exist_ok=True)
        stem = os.path.join(a.save, f"mutant_{a.seed}_{a.index}")
        onnx.save(mutant.model, stem + ".onnx")
        try:
            onnx.save(_optimize(mutant.model)[0], stem + ".fused.onnx")
        except Exception as e:  # noqa: BLE001
            print(f"    optimize raised: {_first_line(e)}")
        print(f"    saved {stem}.onnx")
    return 0 if outcome.status in ("ok", "discarded") else 1


if __name__ == "__main__":
    sys.exit(main())
