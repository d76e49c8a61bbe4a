"""What the schema tests of both ops share: a registry without the op's schema around each test, the
registration round trip, the schema's names, single-node inference and the outputs it should give."""

from __future__ import annotations

from types import ModuleType

import onnx
import pytest
from onnx import helper

from hcfuse._op import OUTPUTS  # the quantized op has the same outputs


def registered(op: ModuleType) -> bool:
    """Whether ONNX knows op's schema (op: hcfuse._op or hcfuse._op_nbits) at op's since-version."""
    key = (op.OP_TYPE, op.SINCE_VERSION, op.DOMAIN)
    return onnx.defs.has(*key) and onnx.defs.get_schema(*key).since_version == op.SINCE_VERSION


def clean_registry_fixture(schema_module: ModuleType, op: ModuleType):
    """An autouse fixture: each test starts without the op's schema (import hcfuse registered it) and gets
    the import state back."""

    @pytest.fixture(autouse=True)
    def clean_registry():
        was_registered = registered(op)
        schema_module.deregister_schema()
        assert not registered(op)
        yield
        schema_module.deregister_schema()
        if was_registered:
            schema_module.register_schema()

    return clean_registry


def check_registration_round_trip(schema_module: ModuleType, op: ModuleType) -> None:
    assert schema_module.register_schema() is True
    assert registered(op)
    assert schema_module.register_schema() is False  # a second import
    schema_module.deregister_schema()
    assert not registered(op)
    schema_module.deregister_schema()  # a no-op when absent


def check_names(schema: onnx.defs.OpSchema, op: ModuleType) -> None:
    """The schema's op type, domain, version, input and output names are op's."""
    assert (schema.name, schema.domain, schema.since_version) == (op.OP_TYPE, op.DOMAIN, op.SINCE_VERSION)
    assert [p.name for p in schema.inputs] == list(op.INPUTS)
    assert [p.name for p in schema.outputs] == list(op.OUTPUTS)


def infer_outputs(schema: onnx.defs.OpSchema, node: onnx.NodeProto,
                  input_types: dict[str, onnx.TypeProto]) -> dict[str, onnx.TypeProto]:
    got = onnx.shape_inference.infer_node_outputs(schema, node, input_types)
    got.pop("", None)  # onnx reports an omitted optional output under "" with T only
    return got


def expect(elem, *shapes) -> dict[str, onnx.TypeProto]:
    """The outputs' types, in output order, all of element type elem."""
    return {OUTPUTS[i]: helper.make_tensor_type_proto(elem, s) for i, s in enumerate(shapes)}
