"""Comparison helpers (bit equality, ulp distance in T); onnxruntime binding that handles bfloat16
(hcfuse.checking._ort_io, re-exported); CPU sessions with graph optimizations off.

Every failure message carries the shape, dtype and row count of what was compared and a mask of
the mismatching cells, so a failing parametrized case says where it broke.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

# onnxruntime binding that handles bfloat16, shared with hcfuse.checking.verification
from hcfuse.checking._ort_io import BFLOAT16, from_ort_value, run_bound, to_ort_value  # noqa: F401
from hcfuse.checking._session import inference_session

_INT_OF = {np.dtype(np.float32): np.int32, np.dtype(np.float16): np.int16, BFLOAT16: np.int16}
UINT_OF = {np.dtype(np.float32): np.uint32, np.dtype(np.float16): np.uint16, BFLOAT16: np.uint16}
_SHOW = 8  # mismatching cells listed in a message


def _describe(a: np.ndarray, what: str) -> str:
    rows = int(np.prod(a.shape[:-1], dtype=np.int64)) if a.ndim else 1
    return f"{what}: shape {a.shape}, dtype {a.dtype}, rows {rows}"


def _check_same_kind(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != expected {expected.dtype}"
    assert actual.dtype in _INT_OF, f"{what}: unsupported dtype {actual.dtype}"


def _mismatch_report(actual, expected, mask, dist, what) -> str:
    idx = np.argwhere(mask)
    lines = [f"{_describe(actual, what)}: {len(idx)} of {actual.size} cells differ"]
    for i in idx[:_SHOW]:
        t = tuple(int(v) for v in i)
        extra = f" ({int(dist[t])} ulp)" if dist is not None else ""
        lines.append(f"  at {t}: got {actual[t]!r}, expected {expected[t]!r}{extra}")
    if mask.ndim >= 1 and mask.size:
        bad_rows = np.argwhere(mask.reshape(-1, mask.shape[-1]).any(axis=-1)).ravel()
        lines.append(f"  rows with mismatches: {bad_rows[:32].tolist()}{' ...' if len(bad_rows) > 32 else ''}")
    return "\n".join(lines)


def assert_bitwise_equal(actual: np.ndarray, expected: np.ndarray, what: str = "output") -> None:
    """Same bits everywhere (NaNs included): for promises about our own outputs."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    _check_same_kind(actual, expected, what)
    u = UINT_OF[actual.dtype]
    mask = actual.view(u) != expected.view(u)
    assert not mask.any(), _mismatch_report(actual, expected, mask, None, what)


def _ordered(a: np.ndarray) -> np.ndarray:
    """Maps floats to integers whose order and differences count ulps (+0 and -0 both map to 0)."""
    i = a.view(_INT_OF[a.dtype]).astype(np.int64)
    lowest = np.iinfo(_INT_OF[a.dtype]).min
    return np.where(i < 0, lowest - i, i)


def ulp_distance(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Per-cell distance in units in the last place of their dtype. NaN vs NaN is 0, NaN vs a number
    is the largest int64."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    _check_same_kind(actual, expected, "ulp_distance")
    dist = np.abs(_ordered(actual) - _ordered(expected))
    an = np.isnan(actual.astype(np.float32))
    en = np.isnan(expected.astype(np.float32))
    dist = np.where(an & en, 0, dist)
    return np.where(an ^ en, np.iinfo(np.int64).max, dist)


def max_ulp(actual: np.ndarray, expected: np.ndarray) -> int:
    d = ulp_distance(actual, expected)
    return int(d.max()) if d.size else 0


def assert_ulp_close(actual: np.ndarray, expected: np.ndarray, max_ulps: int, what: str = "output") -> int:
    """At most max_ulps apart in every cell; returns the largest distance found."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    _check_same_kind(actual, expected, what)
    dist = ulp_distance(actual, expected)
    mask = dist > max_ulps
    assert not mask.any(), f"bound {max_ulps} ulp exceeded\n" + _mismatch_report(actual, expected, mask, dist, what)
    return int(dist.max()) if dist.size else 0


def cpu_session(model, library: str | None = None) -> ort.InferenceSession:
    """model (a ModelProto) on onnxruntime's CPU provider with graph optimizations off, so it runs exactly
    the nodes built; hcfuse's library registered when given."""
    return inference_session(model, library=library)


def run_stock(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of model, run by a plain onnxruntime (CPU, no hcfuse library, optimizations off)."""
    session = cpu_session(model)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def assert_within_bounds(steps: dict, got: dict, limit: dict, what: str) -> None:
    """pre_output and post_gate of got within limit (hcfuse.checking.bounds.output_bounds: scaled ulps per
    element) of the reference's steps; names the worst element."""
    from hcfuse.checking.verification import scaled_ulp

    for name in ("pre_output", "post_gate"):
        gap = scaled_ulp(steps[name], got[name])
        assert gap.shape == limit[name].shape, f"{what}: {name} shape {gap.shape}"
        if gap.size == 0:
            continue
        ratio = gap / limit[name]
        worst = np.unravel_index(np.argmax(ratio), ratio.shape)
        assert ratio[worst] <= 1.0, (
            f"{what}: {name} at {tuple(int(i) for i in worst)} is {gap[worst]:.3g} scaled ulps from the reference, "
            f"over its bound {limit[name][worst]:.3g} (expected {steps[name][worst]!r}, got {got[name][worst]!r}; "
            f"largest gap {gap.max():.3g})")
