"""onnxruntime IO binding that handles bfloat16: its Python API has no bfloat16 numpy type, so
bfloat16 travels as uint16 bits (docs/NUMERICS.md, "bfloat16 in onnxruntime's Python API")."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnx import TensorProto

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def to_ort_value(array: np.ndarray, device: str = "cpu", device_id: int = 0) -> ort.OrtValue:
    """An OrtValue holding array on device, shape kept (0-d included); bfloat16 travels as its uint16 bits."""
    array = np.asarray(array, order="C")  # not np.ascontiguousarray: it turns a 0-d array into 1-d
    if array.dtype == BFLOAT16:
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), TensorProto.BFLOAT16, device, device_id)
        value.update_inplace(array.view(np.uint16))
        return value
    return ort.OrtValue.ortvalue_from_numpy(array, device, device_id)


def from_ort_value(value: ort.OrtValue) -> np.ndarray:
    """A numpy copy of a CPU OrtValue; bfloat16 is read back as uint16 bits and viewed as bfloat16."""
    if value.element_type() != TensorProto.BFLOAT16:
        return value.numpy()
    if value.device_name().lower() != "cpu":
        raise ValueError(f"from_ort_value: bfloat16 read-back needs a CPU OrtValue; got device {value.device_name()}")
    shape = tuple(value.shape())
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return np.zeros(shape, dtype=BFLOAT16)
    buf = (ctypes.c_uint16 * n).from_address(value.data_ptr())
    return np.frombuffer(buf, dtype=np.uint16).copy().view(BFLOAT16).reshape(shape)


def run_bound(session: ort.InferenceSession, feeds: dict[str, np.ndarray], device: str = "cpu",
              device_id: int = 0, run_options: ort.RunOptions | None = None) -> dict[str, np.ndarray]:
    """Runs session with inputs placed on device and every output read back on the CPU."""
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, to_ort_value(array, device, device_id))
    names = [o.name for o in session.get_outputs()]
    for name in names:
        binding.bind_output(name, "cpu")
    session.run_with_iobinding(binding, run_options)
    return {name: from_ort_value(v) for name, v in zip(names, binding.get_outputs())}
