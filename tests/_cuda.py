"""Helpers for the CUDA kernel tests: device capability, sessions with a pinned path, reading device
outputs back (bfloat16 included) and fused chains. The ulp measure the CUDA tests assert is
hcfuse.checking.verification.scaled_ulp."""

from __future__ import annotations

import ctypes

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

from hcfuse._op import (
    DOMAIN,
    INPUTS,
    IR_VERSION,
    ONNX_OPSET,
    OP_TYPE,
    OUTPUTS,
    POST_GATE,
    PRE_OUTPUT,
    STREAMS,
    STREAMS_OUT,
    WEIGHT_INPUTS,
)
from hcfuse.checking._session import CUDA, inference_session
from tests._compare import UINT_OF


def compute_capability() -> tuple[int, int]:
    """(major, minor) of device 0 through the driver API; (0, 0) without a driver or device."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            cu = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return (0, 0)
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cu.cuInit(0) != 0 or cu.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return (0, 0)
    cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    return (major.value, minor.value)


def cuda_session(model, library: str, force_path: str | None, monkeypatch, **cuda_options) -> ort.InferenceSession:
    """A CUDA session of model with hcfuse's library; HCFUSE_FORCE_PATH (read when the kernels are
    created, i.e. in the session constructor) set to force_path, or unset for the automatic choice."""
    if force_path is None:
        monkeypatch.delenv("HCFUSE_FORCE_PATH", raising=False)
    else:
        monkeypatch.setenv("HCFUSE_FORCE_PATH", force_path)
    try:
        return inference_session(model, [(CUDA, cuda_options)], library=library)
    finally:
        monkeypatch.delenv("HCFUSE_FORCE_PATH", raising=False)


def device_to_host(value: ort.OrtValue, dtype) -> np.ndarray:
    """A CUDA OrtValue copied to the host with cudaMemcpy: ORT's Python API reads no bfloat16 device
    tensor. libcudart is the one onnxruntime-gpu's CUDA provider has already loaded."""
    dtype = np.dtype(dtype)
    shape = tuple(value.shape())
    host = np.empty(shape, dtype=UINT_OF[dtype])
    if host.size == 0:
        return host.view(dtype)
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise OSError("device_to_host: no libcudart found in the process")
    err = cudart.cudaMemcpy(ctypes.c_void_p(host.ctypes.data), ctypes.c_void_p(value.data_ptr()),
                            ctypes.c_size_t(host.nbytes), 2)  # cudaMemcpyDeviceToHost
    assert err == 0, f"cudaMemcpy of a {shape} {dtype} output failed with CUDA error {err}"
    return host.view(dtype)


def fused_chain_model(weight_sets: list[dict[str, np.ndarray]], num_blocks: int, *, C: int, H: int, dtype,
                      **attrs):
    """num_blocks fused nodes, block k using weight_sets[k % len(weight_sets)] (initializers, so the
    weights are constant). Block k+1 takes streams = streams_out_k, prev_block_output = pre_output_k
    (an identity sublayer) and prev_post_gate = post_gate_k; block 0 has no prologue. Graph outputs:
    the last block's pre_output, post_gate and streams_out under the op's output names."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(np.asarray(w[n]).astype(dtype), f"w{j}_{n}")
             for j, w in enumerate(weight_sets) for n in WEIGHT_INPUTS]
    nodes, prev = [], None
    for k in range(num_blocks):
        weights = [f"w{k % len(weight_sets)}_{n}" for n in WEIGHT_INPUTS]
        last = k == num_blocks - 1
        outs = list(OUTPUTS) if last else [f"{n}_{k}" for n in OUTPUTS]
        if prev is None:
            ins = [INPUTS[STREAMS], *weights]
        else:  # streams, weights, prev_block_output, prev_post_gate from the block before
            ins = [prev[STREAMS_OUT], *weights, prev[PRE_OUTPUT], prev[POST_GATE]]
        nodes.append(helper.make_node(OP_TYPE, ins, outs, domain=DOMAIN, name=f"block_{k}", num_branches=C, **attrs))
        prev = outs
    widths = {"pre_output": H, "post_gate": C, "streams_out": C * H}
    graph = helper.make_graph(
        nodes, "hc_fused_chain", [helper.make_tensor_value_info(INPUTS[STREAMS], elem, ["rows", C * H])],
        [helper.make_tensor_value_info(n, elem, ["rows", widths[n]]) for n in OUTPUTS], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=IR_VERSION)
