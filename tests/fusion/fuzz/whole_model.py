"""Mutations of the whole model rather than of one block: value_info stripped, unnamed nodes, the chain
inside a model-local function or both branches of an If, a second chain of another C in the graph."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_ir as ir

from hcfuse import _op
from tests.fusion.fuzz.bases import CONTRIB, MOBIUS, blocks, build
from tests.fusion.fuzz.edits import initializer, random_like

def strip_shapes(model, ctx):
    """No value_info: intermediate values lose their shapes (and maybe element types); maybe the graph
    inputs and outputs too (an exporter or a pass that drops them)."""
    types = bool(ctx.rng.random() < 0.5)
    io = bool(ctx.rng.random() < 0.3)
    for node in model.graph:
        for value in node.outputs:
            if value.is_graph_output():
                continue
            value.shape = None
            if types and not value.is_graph_output():
                value.type = None
    if io:
        for value in [*model.graph.inputs, *model.graph.outputs]:
            if value.const_value is None and value.shape is not None:
                value.shape = ir.Shape([None] * len(value.shape))  # graph inputs and outputs keep their rank
    return f"strip_shapes:{'types ' if types else ''}{'io' if io else 'intermediates'}"


def in_function(model, ctx):
    """The whole chain inside a model-local function called by the main graph (initializers become
    Constant nodes); maybe with an attribute given by reference (ref_attr_name)."""
    if ctx.late:
        return None  # one function
    ref = ctx.pick([None, "epsilon", "num_branches"])
    if ref == "epsilon" and not any(n.op_type == _op.BRANCH_NORM and "epsilon" in n.attributes for n in model.graph):
        ref = None
    ctx.late.append((_wrap_in_function, (ref,)))
    return f"in_function:{'ref ' + ref if ref else 'plain'}"


def in_if(model, ctx):
    """The whole chain inside both branches of an If on a boolean graph input (a subgraph reading the
    main graph's inputs and initializers from the outer scope); the feed picks a branch."""
    if ctx.late:
        return None  # one wrapper
    flag = bool(ctx.rng.random() < 0.5)
    cond = ir.Value(name="fuzz_cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    model.graph.inputs.append(cond)
    ctx.feeds["fuzz_cond"] = np.array(flag)
    ctx.late.append((_wrap_in_if, ()))
    return f"in_if:{'then' if flag else 'else'} branch"


def _branch(graph: onnx.GraphProto, tag: str) -> onnx.GraphProto:
    """graph's nodes as an If branch: values it computes renamed tag/..., outer-scope names kept."""
    outer = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    rename = {}

    def name(n: str) -> str:
        return n if not n or n in outer else rename.setdefault(n, f"{tag}/{n}")

    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = f"{tag}/{node.name}" if node.name else ""
        copy.input[:] = [name(n) for n in node.input]
        copy.output[:] = [name(n) for n in node.output]
        nodes.append(copy)
    infos = []
    for value in [*graph.value_info, *graph.output]:
        info = onnx.ValueInfoProto()
        info.CopyFrom(value)
        info.name = name(value.name)
        infos.append(info)
    outputs, value_info = infos[len(graph.value_info):], infos[:len(graph.value_info)]
    return onnx.helper.make_graph(nodes, tag, [], outputs, value_info=value_info)


def _wrap_in_if(proto: onnx.ModelProto) -> None:
    graph = proto.graph
    then_branch, else_branch = _branch(graph, "then"), _branch(graph, "else")
    node = onnx.helper.make_node("If", ["fuzz_cond"], [v.name for v in graph.output], name="fuzz_if",
                                 then_branch=then_branch, else_branch=else_branch)
    del graph.node[:]
    graph.node.append(node)
    del graph.value_info[:]


def node_names(model, ctx):
    """Nodes without names (exporters leave them out; one name on every node onnxruntime refuses)."""
    for node in model.graph:
        node.name = ""
    return "node_names:empty"


# options of the second chain: one input (the embeddings), no extra Add in front of a block
_PLAIN_SECOND_CHAIN = {
    CONTRIB: {"weights_as_inputs": False, "tile_embeddings": True, "extra_add_before": ()},
    MOBIUS: {"ple_before": (), "token_mask": False},
}


def two_chains(model, ctx):
    """A second, independent chain of another C (same H and type) in the same graph; maybe one (H) norm
    scale shared by a block of each (flattened once per C), or one packed weight name prefix."""
    base = ctx.base
    C2 = 2 if base.C != 2 else 4
    other = dataclasses.replace(base, C=C2, R=int(ctx.rng.choice([2, 4, 8])), prologue_first=False,
                                num_blocks=int(ctx.rng.integers(1, 3)),
                                options={**base.options, **_PLAIN_SECOND_CHAIN.get(base.form,
                                                                                  _PLAIN_SECOND_CHAIN[CONTRIB])})
    graph = build(other).graph
    prefix = ctx.name("chain") + "/"
    for value in [*graph.inputs, *graph.initializers.values()]:
        value.name = prefix + value.name
    nodes = list(graph)
    for node in nodes:
        node.name = prefix + node.name
        for value in node.outputs:
            value.name = prefix + value.name
    inputs, outputs, inits = list(graph.inputs), list(graph.outputs), list(graph.initializers.values())
    graph.inputs.clear()
    graph.outputs.clear()
    graph.initializers.clear()
    graph.remove(nodes)
    model.graph.extend(nodes)
    model.graph.inputs.extend(inputs)
    model.graph.outputs.extend(outputs)
    for value in inits:
        model.graph.register_initializer(value)
    (embeds,) = inputs
    ctx.feeds[embeds.name] = random_like(ctx, (*base.lead, base.H))
    shared = ""
    if ctx.rng.random() < 0.6:
        mine, theirs = ctx.pick(blocks(model)[:base.num_blocks]), ctx.pick(blocks(model)[base.num_blocks:])
        if mine is not None and theirs is not None and mine.get("scale") is not None:
            tensor = ir.convenience.get_const_tensor(mine["scale"])
            if tensor is not None and tensor.shape.dims[-1] % base.H == 0:
                scale = initializer(model, ctx.name("shared_scale_h"), np.asarray(tensor.numpy()).reshape(-1)[:base.H])
                mine["norm"].replace_input_with(1, scale)
                theirs["norm"].replace_input_with(1, scale)
                shared = " sharing an (H) scale"
    return f"two_chains:C={C2}{shared}"


def _wrap_in_function(proto: onnx.ModelProto, ref: str | None) -> None:
    graph = proto.graph
    inits = {t.name for t in graph.initializer}
    nodes = [onnx.helper.make_node("Constant", [], [t.name], value=t) for t in graph.initializer]
    attr_value = None
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        if ref:
            for a in copy.attribute:
                if a.name == ref and node.op_type in (_op.BRANCH_NORM, _op.PRE_MIX, _op.POST_MIX):
                    attr_value = onnx.helper.get_attribute_value(a) if attr_value is None else attr_value
                    if onnx.helper.get_attribute_value(a) == attr_value:
                        kind = a.type
                        a.Clear()
                        a.name, a.ref_attr_name, a.type = ref, "fuzz_" + ref, kind
        nodes.append(copy)
    inputs = [v.name for v in graph.input if v.name not in inits]
    outputs = [v.name for v in graph.output]
    imports = list(proto.opset_import)
    fn = onnx.helper.make_function("fuzz.local", "Chain", inputs, outputs, nodes, imports,
                                   attributes=[] if attr_value is None else ["fuzz_" + ref])
    call_attrs = {} if attr_value is None else {"fuzz_" + ref: attr_value}
    call = onnx.helper.make_node("Chain", inputs, outputs, domain="fuzz.local", name="fuzz_chain", **call_attrs)
    del graph.node[:]
    graph.node.append(call)
    del graph.initializer[:]
    keep = [v for v in graph.input if v.name not in inits]
    del graph.input[:]
    graph.input.extend(keep)
    del graph.value_info[:]
    proto.functions.append(fn)
    proto.opset_import.append(onnx.helper.make_opsetid("fuzz.local", 1))
