"""Seeded mutations of a stock chain that keep it a model (run.py discards those onnxruntime cannot run).

Each mutation takes (model, ctx), changes the onnx_ir model in place and returns a label
"kind:detail" saying what it did, or None where it does not apply to this model. A label's kind is
the class the fuzz summary counts by, and what tests/fusion/test_fuzz_fusion.py's KNOWN_OPEN names.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from tests.fusion.fuzz.bases import blocks
from tests.fusion.fuzz.edits import (
    Context,
    add_node,
    add_silu_scale,
    as_initializer,
    constant_node,
    graph_input,
    initializer,
    declared_lead,
    nodes_before,
    random_like,
    set_attr,
    unknown_dims,
)
from tests.fusion.fuzz.nbits import nbits
from tests.fusion.fuzz.whole_model import in_function, in_if, node_names, strip_shapes, two_chains

__all__ = ["MUTATIONS", "Context"]


# ---- mutations of one block --------------------------------------------------------------------


def swap_inputs(model, ctx):
    """Two inputs of one block node exchanged (PreMix hn/g, Div, Mul, PostMix, a MatMul), or the uses of
    the two Split outputs (runnable where R == C)."""
    b = ctx.block(model)
    if b is None:
        return None
    if b.get("split") is not None and ctx.rng.random() < 0.25:
        down, inject = b["split"].outputs[:2]
        users_down, users_inject = list(down.uses()), list(inject.uses())
        for user, i in users_down:
            user.replace_input_with(i, inject)
        for user, i in users_inject:
            user.replace_input_with(i, down)
        return "swap_inputs:Split outputs"
    node = ctx.pick([b.get(k) for k in ("premix", "div", "mul", "post", "up_mm", "down_mm", "inject_mm", "packed_mm")])
    if node is None:
        return None
    slots = [i for i, v in enumerate(node.inputs) if v is not None]
    i, j = sorted(ctx.rng.choice(slots, 2, replace=False).tolist())
    a, c = node.inputs[i], node.inputs[j]
    node.replace_input_with(i, c)
    node.replace_input_with(j, a)
    return f"swap_inputs:{node.op_type}[{i},{j}]"


def attr_change(model, ctx):
    """One attribute of a block node changed or removed, so the block's attributes no longer agree."""
    b = ctx.block(model)
    if b is None:
        return None
    C, rank = ctx.base.C, len(ctx.base.leading_dims) + 1
    branches = [0, 1, 2, 2 * C, max(1, C // 2), None]
    choices = {
        "norm": [("num_branches", branches), ("epsilon", [1e-3, 0.5, None])],
        "premix": [("num_branches", branches), ("reduction_scale", [1.0, 0.5, 3.0, None])],
        "post": [("num_branches", branches)],
        "silu": [("alpha", [0.5, 2.0, None])],
        "split": [("axis", [rank - 1, 0, 1, -2, None])],
    }
    role = ctx.pick([r for r in choices if b.get(r) is not None])
    name, values = choices[role][int(ctx.rng.integers(len(choices[role])))]
    value = values[int(ctx.rng.integers(len(values)))]
    set_attr(b[role], name, value)
    return f"attr_change:{b[role].op_type}.{name}={value}"


def grouped_form(model, ctx):
    """A block in the stock ops' grouped form: streams reshaped to (..., C, H), norm and pre-mix with
    num_branches 0 (or absent), weights acting per branch ((H, R), (R, H), (H, 1)): it runs, but it is
    not the fused op's block (its products span H features, not C*H), so it must stay unfused."""
    b = ctx.block(model, ("premix", "up_w", "silu"))
    if b is None or b["norm"].inputs[0] is None:
        return None
    C, H, R = ctx.base.C, ctx.base.H, ctx.base.R
    lead = len(ctx.base.leading_dims)
    norm = b["norm"]
    shape = initializer(model, ctx.name("grouped_shape"), np.array([0] * lead + [C, H], np.int64))
    grouped = add_node(model, norm, "Reshape", [norm.inputs[0], shape], dtype=ctx.T, shape=None,
                        name=ctx.name("grouped_streams"))
    norm.replace_input_with(0, grouped)
    value = ctx.pick([0, None])
    for role in ("norm", "premix"):
        set_attr(b[role], "num_branches", value)
    weights = {"up_w": (R, H), "down_w": (H, R), "inject_w": (H, 1), "packed_w": (H, R + 1)}
    for role, dims in weights.items():
        slot = _consumer_slot(b, role)
        if slot is not None:
            slot[0].replace_input_with(slot[1], initializer(model, ctx.name(role + "_grouped"),
                                                             random_like(ctx, dims, dims[0] ** -0.5)))
    if b.get("split") is not None:
        b["split"].resize_inputs(2)
        b["split"].replace_input_with(1, initializer(model, ctx.name("sizes_grouped"), np.array([R, 1], np.int64)))
    for role in ("hn", "down", "inject", "d", "up", "g", "gate", "packed_out", "div_out", "sig_out"):
        v = _intermediate(b, role) if role in _INTERMEDIATES else b.get(role)
        if v is not None and not v.is_graph_output():
            v.shape = None
    return f"grouped_form:num_branches={value}"


def _scalar_role(model, ctx, shaped: bool = False):
    """(block, role, value) of a gate constant or (added) ScaledSiLU scale input."""
    b = ctx.block(model)
    if b is None:
        return None
    roles = [r for r in ("gate_div", "gate_mul") if b.get(r) is not None]
    if b.get("silu") is not None and not shaped:
        roles.append("silu_scale")  # the stock ScaledSiLU takes a 0-d scale only
    role = ctx.pick(roles)
    if role is None:
        return None
    if role == "silu_scale":
        silu = b["silu"]
        if len(silu.inputs) < 2 or silu.inputs[1] is None:
            add_silu_scale(model, ctx, b, np.array(float(ctx.rng.choice([0.5, 1.25])), ctx.np_T))
        return b, role, silu.inputs[1], silu, 1
    node = b["div"] if role == "gate_div" else b["mul"]
    index = [i for i, v in enumerate(node.inputs) if v is b[role]][0]
    return b, role, b[role], node, index


def const_shape(model, ctx):
    """A gate constant or the ScaledSiLU scale replaced by a non-scalar tensor (equal or distinct values)."""
    found = _scalar_role(model, ctx, shaped=True)
    if found is None:
        return None
    b, role, value, node, index = found
    tensor = ir.convenience.get_const_tensor(value)
    v = float(tensor.numpy().reshape(-1)[0]) if tensor is not None else 2.0
    C, R = ctx.base.C, ctx.base.R
    width = R if role == "silu_scale" else C
    shapes = [(1, 1), (width,), (1, width), (1,), (2,) if width != 2 else (3,)]
    shape = shapes[int(ctx.rng.integers(len(shapes)))]
    distinct = bool(ctx.rng.random() < 0.5)
    array = np.full(shape, v, np.float64)
    if distinct:
        array = array * ctx.rng.uniform(0.5, 1.5, shape)
    new = initializer(model, ctx.name(f"{role}_shaped"), array.astype(ctx.np_T))
    node.replace_input_with(index, new)
    return f"const_shape:{role}{list(shape)}{'distinct' if distinct else 'equal'}"


def const_nonconst(model, ctx):
    """A gate constant, the ScaledSiLU scale or the Split sizes made non-constant (graph input, computed
    by a node) or given as an unusual constant (Constant with value_float(s))."""
    if ctx.rng.random() < 0.2:
        b = ctx.block(model, ("split", "sizes"))
        if b is not None:
            sizes = ir.convenience.get_const_tensor(b["sizes"])
            array = np.asarray(sizes.numpy()) if sizes is not None else np.array([ctx.base.R, ctx.base.C], np.int64)
            b["split"].replace_input_with(1, graph_input(model, ctx, ctx.name("split_sizes"), array))
            return "const_nonconst:split sizes as graph input"
    found = _scalar_role(model, ctx)
    if found is None:
        return None
    b, role, value, node, index = found
    tensor = ir.convenience.get_const_tensor(value)
    v = float(tensor.numpy().reshape(-1)[0]) if tensor is not None else 2.0
    shape = tuple(tensor.shape.dims) if tensor is not None else ()
    form = ctx.pick(["graph_input", "identity", "value_float", "value_floats", "neg_neg"])
    if role == "silu_scale":
        shape = ()  # ScaledSiLU's scale must be 0-d
    if form in ("value_float", "value_floats") and ctx.T != ir.DataType.FLOAT:
        form = "identity"  # value_float(s) make float tensors only
    if form == "value_floats" and role == "silu_scale":
        form = "value_float"
    if form == "graph_input":
        new = graph_input(model, ctx, ctx.name(role), np.full(shape, v * ctx.rng.uniform(0.5, 1.5), ctx.np_T))
    elif form == "value_float":
        new = constant_node(model, node, ctx.name(role), {"value_float": v}, ctx.T, ())
    elif form == "value_floats":
        new = constant_node(model, node, ctx.name(role), {"value_floats": [v]}, ctx.T, (1,))
    else:
        const = initializer(model, ctx.name(role + "_src"), np.full(shape, v, ctx.np_T))
        if form == "neg_neg":
            const = add_node(model, node, "Neg", [const], dtype=ctx.T, shape=shape, name=ctx.name(role + "_neg"))
        new = add_node(model, node, "Neg" if form == "neg_neg" else "Identity", [const], dtype=ctx.T, shape=shape,
                        name=ctx.name(role))
    node.replace_input_with(index, new)
    return f"const_nonconst:{role} {form}"


_OVERRIDABLE_ROLES = ("gate_div", "gate_mul", "silu_scale", "sizes", "scale", "scale_grouped", "scale_shared",
                      "packed_w", "down_w", "up_w", "inject_w")
_NEEDS = {"silu_scale": "silu", "scale_grouped": "scale", "scale_shared": "scale"}  # role -> block part it needs


def overridable(model, ctx):
    """A value the rewrite reads at fuse time (gate constants, ScaledSiLU scale, Split sizes, the norm
    scale in each accepted layout, a weight) becomes an initializer that is also a graph input: only a
    default, fed with other values at run time."""
    b = ctx.block(model)
    if b is None:
        return None
    role = ctx.pick([r for r in _OVERRIDABLE_ROLES if b.get(_NEEDS.get(r, r)) is not None])
    if role is None:
        return None
    if role == "silu_scale":
        silu = b["silu"]
        if len(silu.inputs) < 2 or silu.inputs[1] is None:
            add_silu_scale(model, ctx, b, np.array(0.75, ctx.np_T))
        value = silu.inputs[1]
    elif role in ("scale_grouped", "scale_shared"):
        value = _scale_layout(model, ctx, b, role.split("_")[1])
        if value is None:
            return None
    else:
        value = b[role]
    value = as_initializer(model, value)
    if value is None or value.is_graph_input():
        return None
    model.graph.inputs.append(value)
    return f"overridable:{role}"


def _scale_layout(model, ctx, b: dict, layout: str) -> ir.Value | None:
    """Block b's norm scale replaced by a constant of the (C, H) or (H) layout the stock norm accepts."""
    tensor = ir.convenience.get_const_tensor(b["scale"])
    C, H = ctx.base.C, ctx.base.H
    if tensor is None or tuple(tensor.shape.dims) != (C * H,):
        return None
    flat = np.asarray(tensor.numpy())
    array = flat.reshape(C, H) if layout == "grouped" else flat[:H].copy()
    value = initializer(model, ctx.name(f"scale_{layout}"), array)
    b["norm"].replace_input_with(1, value)
    return value


def norm_layout(model, ctx):
    """The norm scale as a (C, H) or (H) constant, possibly shared by every block (one (H) scale read by
    several blocks is flattened once per width)."""
    bs = [b for b in blocks(model) if b.get("scale") is not None]
    if not bs:
        return None
    layout = ctx.pick(["grouped", "shared"])
    b = ctx.pick(bs)
    value = _scale_layout(model, ctx, b, layout)
    if value is None:
        return None
    shared = len(bs) > 1 and ctx.rng.random() < 0.5
    if shared:
        for other in bs:
            other["norm"].replace_input_with(1, value)
    return f"norm_layout:{layout}{' shared by all blocks' if shared else ''}"


_INTERMEDIATES = ("hn", "down", "inject", "d", "up", "g", "packed_out", "div_out", "sig_out", "s")


def _intermediate(b: dict, role: str):
    if role == "packed_out":
        return b["packed_mm"].outputs[0] if b.get("packed_mm") is not None else None
    if role == "div_out":
        return b["div"].outputs[0] if b.get("div") is not None else None
    if role == "sig_out":
        return b["gate_sig"].outputs[0] if b.get("gate_sig") is not None and b.get("mul") is not None else None
    if role == "s":
        return b["streams"] if b.get("post") is not None else None
    return b.get(role)


def extra_consumer(model, ctx):
    """An intermediate of a block also read by a node outside it (whose output becomes a graph output)."""
    b = ctx.block(model)
    if b is None:
        return None
    role = ctx.pick([r for r in _INTERMEDIATES if _intermediate(b, r) is not None])
    if role is None:
        return None
    value = _intermediate(b, role)
    out = ir.Value(name=ctx.name(f"spy_{role}"), type=ir.TensorType(ctx.T), shape=value.shape or unknown_dims(ctx))
    model.graph.append(ir.node("Neg", [value], outputs=[out], name=out.name + "/node"))
    model.graph.outputs.append(out)
    return f"extra_consumer:{role}"


def extra_output(model, ctx):
    """An intermediate of a block (or its pre / gate / S) made a graph output as it is."""
    b = ctx.block(model)
    if b is None:
        return None
    role = ctx.pick([r for r in (*_INTERMEDIATES, "pre", "gate") if _intermediate(b, r) is not None])
    if role is None:
        return None
    value = _intermediate(b, role)
    if value.is_graph_output():
        return None
    if value.type is None or value.shape is None:  # a graph output needs both (strip_shapes removes them)
        value.type, value.shape = ir.TensorType(ctx.T), value.shape or unknown_dims(ctx)
    model.graph.outputs.append(value)
    return f"extra_output:{role}"


_REPLACEMENTS = {
    "up_sig": ["Tanh", "Relu", "Identity", "HardSigmoid"],
    "gate_sig": ["Tanh", "Relu", "Identity", "Softsign"],
    "mul": ["Add", "Sub", "Div"],
    "div": ["Mul", "Sub", "Add"],
    "silu": ["Sigmoid", "Identity", "Relu"],
    "norm": ["Identity"],
    "premix": [],
}


def replace_op(model, ctx):
    """A block node replaced by another op with compatible shapes (Sigmoid->Tanh, Mul->Add, ScaledSiLU->
    Sigmoid, BranchwiseRMSNorm->Identity, ...)."""
    b = ctx.block(model)
    if b is None:
        return None
    role = ctx.pick([r for r, ops in _REPLACEMENTS.items() if ops and b.get(r) is not None])
    if role is None:
        return None
    node = b[role]
    new_op = ctx.pick(_REPLACEMENTS[role])
    before = node.op_type
    node.op_type = new_op
    node.domain = ""
    node.attributes.clear()
    if new_op in ("Tanh", "Relu", "Identity", "HardSigmoid", "Softsign", "Sigmoid"):
        node.resize_inputs(1)
    return f"replace_op:{before}->{new_op}"


def split_change(model, ctx):
    """The packed Split changed: sizes swapped (runnable where R == C), a third output of a wider weight,
    num_outputs instead of sizes (opset 18+), or an equivalent positive axis."""
    b = ctx.block(model, ("split",))
    if b is None:
        return None
    split, R, C = b["split"], ctx.base.R, ctx.base.C
    # num_outputs: Split's from opset 18 (onnx.checker refuses it before)
    form = ctx.pick(["swapped", "three", "num_outputs" if ctx.base.opset >= 18 else None, "positive_axis"])
    if form == "num_outputs":
        if len(split.outputs) != 2:  # (onnxruntime's Split aborts on 3 outputs of num_outputs 2)
            return None
        split.resize_inputs(1)
        set_attr(split, "num_outputs", 2)
    elif form == "positive_axis":
        set_attr(split, "axis", len(ctx.base.leading_dims))
    elif form == "three":  # the packed weight one column wider, the third output unused
        mm, weight = b["packed_mm"], b.get("packed_w")
        tensor = None if weight is None or mm.op_type != "MatMul" else ir.convenience.get_const_tensor(weight)
        if tensor is None:
            return None
        array = np.asarray(tensor.numpy())
        column = random_like(ctx, (array.shape[0], 1), array.shape[0] ** -0.5)
        mm.replace_input_with(1, initializer(model, ctx.name("packed_w3"), np.concatenate([array, column], 1)))
        mm.outputs[0].shape = None
        split.resize_inputs(2)
        split.replace_input_with(1, initializer(model, ctx.name("sizes3"), np.array([R, C, 1], np.int64)))
        set_attr(split, "num_outputs", None)
        split.resize_outputs(3)
        split.outputs[2].name = ctx.name("split_extra")
    else:
        split.resize_inputs(2)
        split.replace_input_with(1, initializer(model, ctx.name("sizes"), np.array([C, R], np.int64)))
    return f"split_change:{form}"


_WEIGHT_ROLES = ("scale", "down_w", "up_w", "inject_w", "packed_w", "sizes", "gate_div", "gate_mul")


def _consumer_slot(b: dict, role: str):
    """(node, input index) through which block b reads its value of role."""
    owner = {"scale": "norm", "down_w": "down_mm", "up_w": "up_mm", "inject_w": "inject_mm",
             "packed_w": "packed_mm", "sizes": "split", "gate_div": "div", "gate_mul": "mul"}[role]
    node = b.get(owner)
    if node is None or b.get(role) is None:
        return None
    index = [i for i, v in enumerate(node.inputs) if v is b[role]]
    return (node, index[0]) if index else None


def shared_weight(model, ctx):
    """Block j reads block i's weight (or constant) of one role: one tensor, two blocks."""
    bs = blocks(model)
    if len(bs) < 2:
        return None
    i, j = ctx.rng.choice(len(bs), 2, replace=False).tolist()
    roles = [r for r in _WEIGHT_ROLES if bs[i].get(r) is not None and _consumer_slot(bs[j], r) is not None]
    role = ctx.pick(roles)
    if role is None:
        return None
    node, index = _consumer_slot(bs[j], role)
    if bs[i][role].producer() is not None and bs[i][role].producer() not in nodes_before(model, node):
        return None
    node.replace_input_with(index, bs[i][role])
    return f"shared_weight:{role}"


def transposed_weight(model, ctx):
    """A MatMul weight computed by Transpose of its transposed initializer (a weight an upstream node
    produces), or the same weight read once through a Transpose and once directly."""
    b = ctx.block(model)
    if b is None:
        return None
    role = ctx.pick([r for r in ("down_w", "up_w", "inject_w", "packed_w") if _consumer_slot(b, r) is not None])
    if role is None:
        return None
    node, index = _consumer_slot(b, role)
    tensor = ir.convenience.get_const_tensor(b[role])
    if tensor is None:
        return None
    array = np.asarray(tensor.numpy())
    src = initializer(model, ctx.name(role + "_T"), np.ascontiguousarray(array.T))
    out = add_node(model, node, "Transpose", [src], {"perm": [1, 0]}, dtype=ctx.T, shape=array.shape,
                    name=ctx.name(role + "_transposed"))
    node.replace_input_with(index, out)
    return f"transposed_weight:{role}"


_SLOTS = {  # consumer slot -> roles of values (from any block) that may be wired into it
    ("norm", 0): ("streams", "hn", "g", "up"),
    ("premix", 0): ("hn", "g", "streams"),
    ("premix", 1): ("g", "hn", "up"),
    ("up_mm", 0): ("d", "down"),
    ("silu", 0): ("down", "d"),
    ("up_sig", 0): ("up", "hn"),
    ("gate_sig", 0): ("inject", "div_out"),
    ("div", 0): ("inject",),
    ("post", 0): ("streams", "hn"),
    ("post", 1): ("pre",),
    ("post", 2): ("gate", "inject"),
    ("down_mm", 0): ("hn", "streams"),
    ("inject_mm", 0): ("hn", "streams"),
    ("packed_mm", 0): ("hn", "streams"),
}


def wrong_producer(model, ctx):
    """One input of a block node wired to another producer: another block's (or the same block's other)
    value of a compatible shape, always one computed earlier (the graph stays acyclic)."""
    bs = blocks(model)
    b = ctx.pick(bs)
    if b is None:
        return None
    slot = ctx.pick([s for s in _SLOTS if b.get(s[0]) is not None])
    if slot is None:
        return None
    node = b[slot[0]]
    earlier = nodes_before(model, node)
    current = node.inputs[slot[1]] if len(node.inputs) > slot[1] else None
    candidates = []
    for other in bs:
        for role in _SLOTS[slot]:
            value = _intermediate(other, role) if role in _INTERMEDIATES else other.get(role)
            if value is None or value is current:
                continue
            producer = value.producer()
            if producer is None or producer in earlier:
                candidates.append((other is b, role, value))
    choice = ctx.pick(candidates)
    if choice is None:
        return None
    same, role, value = choice
    node.replace_input_with(slot[1], value)
    return f"wrong_producer:{slot[0]}[{slot[1]}]<-{'same' if same else 'other'} block {role}"


def name_clash(model, ctx):
    """A value already named like one the rewrite derives (`<packed>.down`, `<packed>.inject`,
    `<scale>.flat`, the final mix's zero inject weight), holding something else and in use."""
    b = ctx.block(model)
    if b is None:
        return None
    C, H, CH = ctx.base.C, ctx.base.H, ctx.base.C * ctx.base.H
    names = []
    if b.get("packed_w") is not None:
        names += [(f"{b['packed_w'].name}.down", (CH, ctx.base.R)), (f"{b['packed_w'].name}.inject", (CH, C))]
    if b.get("scale") is not None and ctx.rng.random() < 0.5:
        value = _scale_layout(model, ctx, b, ctx.pick(["grouped", "shared"]))
        if value is not None:
            names.append((f"{value.name}.flat", (CH,)))
    if b.get("scale") is not None and b["scale"].const_value is not None:
        names.append((f"{b['scale'].name}.flat", (CH,)))
    names.append((f"hcfuse.zero_inject_weight.{CH}x{C}.{ctx.T.name}", (CH, C)))
    name, shape = names[int(ctx.rng.integers(len(names)))]
    if model.graph.initializers.get(name) is not None:
        return None
    form = ctx.pick(["initializer", "graph_input", "node_output"])
    if ctx.rng.random() < 0.3:
        shape = (shape[0] // 2, *shape[1:])  # and of another shape
    array = random_like(ctx, shape)
    if form == "initializer":
        value = initializer(model, name, array)
    elif form == "graph_input":
        value = graph_input(model, ctx, name, array)
    else:
        src = initializer(model, ctx.name("clash_src"), array)
        value = ir.Value(name=name, type=ir.TensorType(ctx.T), shape=ir.Shape(shape))
        model.graph.append(ir.node("Identity", [src], outputs=[value], name=ctx.name("clash")))
    out = ir.Value(name=ctx.name("clash_out"), type=ir.TensorType(ctx.T), shape=ir.Shape(shape))
    model.graph.append(ir.node("Neg", [value], outputs=[out], name=out.name + "/node"))
    model.graph.outputs.append(out)
    return f"name_clash:{form} {name.rsplit('.', 1)[-1] if 'zero_inject' not in name else 'zero_inject'}"


def postmix_form(model, ctx):
    """A prologue PostMix in another accepted form: per-feature post_mix (..., C, H), (..., C, 1),
    a prev_block_output of unknown shape, or a stream_mix input."""
    b = ctx.block(model, ("post",))
    if b is None:
        return None
    post, C, H, lead = b["post"], ctx.base.C, ctx.base.H, ctx.base.lead
    form = ctx.pick(["post_mix_CH", "post_mix_C1", "prev_out_unknown", "stream_mix"])
    if form.startswith("post_mix"):
        shape = {"post_mix_CH": (C, H), "post_mix_C1": (C, 1)}[form]
        array = ctx.rng.uniform(0.0, 2.0, (*lead, *shape)).astype(ctx.np_T)
        dims = False if ctx.rng.random() < 0.3 else [*declared_lead(ctx), *shape]
        post.replace_input_with(2, graph_input(model, ctx, ctx.name("post_mix"), array, dims))
        if ctx.rng.random() < 0.5 and post.inputs[1].producer() is not None:
            post.inputs[1].shape = None  # prev_block_output of unknown shape too (no value_info)
            form += "+prev_out_unknown"
    elif form == "prev_out_unknown":
        array = random_like(ctx, (*lead, H))
        post.replace_input_with(1, graph_input(model, ctx, ctx.name("prev_out"), array, False))
    else:
        array = random_like(ctx, (*lead, C, C), 0.5)
        post.resize_inputs(4)
        post.replace_input_with(3, graph_input(model, ctx, ctx.name("stream_mix"), array))
    return f"postmix_form:{form}"


def lying_shapes(model, ctx):
    """A value_info that contradicts the graph (onnxruntime warns and runs): a prologue's post_mix
    computed as (..., C, H) but declared (..., C), or an intermediate of a block declared with another
    last dim or rank. The pass must prove facts from the graph, not trust such a declaration."""
    C, H = ctx.base.C, ctx.base.H
    b = ctx.block(model, ("post",)) if ctx.rng.random() < 0.5 else None
    if b is not None:
        post = b["post"]
        source = graph_input(model, ctx, ctx.name("post_mix_ch"),
                             ctx.rng.uniform(0.0, 2.0, (*ctx.base.lead, C, H)).astype(ctx.np_T))
        declared = add_node(model, post, "Identity", [source], dtype=ctx.T, shape=[*declared_lead(ctx), C],
                            name=ctx.name("post_mix_declared_c"))
        post.replace_input_with(2, declared)
        return "lying_shapes:post_mix (..., C, H) declared (..., C)"
    b = ctx.block(model)
    if b is None:
        return None
    role = ctx.pick([r for r in _INTERMEDIATES if _intermediate(b, r) is not None and not _intermediate(b, r).is_graph_output()])
    if role is None:
        return None
    value = _intermediate(b, role)
    value.type = value.type or ir.TensorType(ctx.T)  # a declared shape needs its type (strip_shapes removes it)
    dims = [*declared_lead(ctx), C * H]
    form = ctx.pick(["last", "rank"])
    value.shape = ir.Shape(dims[:-1] + [int(ctx.rng.choice([C, H, C * H, 1]))] if form == "last" else [*dims, 1])
    return f"lying_shapes:{role} {form}"


MUTATIONS = {
    f.__name__: f
    for f in (swap_inputs, attr_change, grouped_form, const_shape, const_nonconst, overridable, norm_layout, extra_consumer,
              extra_output, replace_op, split_change, shared_weight, transposed_weight, wrong_producer,
              name_clash, strip_shapes, postmix_form, in_function, in_if, node_names, two_chains, lying_shapes, nbits)
}

