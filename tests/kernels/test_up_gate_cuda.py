"""The general path's two routes for the up product and the gate epilogue (kernels/src/cuda/general/hc_general.cu):
"fused", HcUpGateKernel (kernels/src/cuda/general/hc_up_gate_sm90.cu: wgmma on TMA-fed 128 x 256 tiles of all
4 branches, the epilogue from the accumulators; sm_90, 16-bit T, C = 4, H a multiple of 64, R a multiple of 8),
and "unfused", cuBLASLt's product and HcGateEpilogueKernel. The library takes HcUpGateRoute::kAuto's choice
(fused for bfloat16, for float16 from 256 rows); a library built with HCFUSE_DEV_KNOBS also reads
HCFUSE_UP_GATE (1 or 0), which pins a route: there every case runs on both routes, elsewhere on the route
kAuto takes.

Asserted for each route: that it is the route that ran (HCFUSE_DEBUG's launch line), the real shape
against hcfuse.reference at row counts of every range (rows not a multiple of the 128-row tile), awkward
shapes (H = 64 ... 640, R = 8 ... 104: K not a multiple of the 64-wide step, one h tile), row independence
inside a range and determinism across sessions, and NaN / infinite up values. Bounds are
tests/kernels/test_kernels_cuda.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from tests._compare import assert_bitwise_equal, run_bound
from tests._cuda import compute_capability, cuda_session
from tests.kernels.test_kernels_cuda import BF16, DTYPE_IDS, DTYPES, QWEN, QWEN_ATTRS, _check, _reference, _require_dtype

pytestmark = pytest.mark.cuda

DTYPES16 = [np.dtype(np.float16), BF16]
DTYPE16_IDS = ["fp16", "bf16"]
ROUTES = {"fused": "1", "unfused": "0"}
FUSED_LINE = "up and gate epilogue fused (HcUpGateKernel)"


@pytest.fixture(scope="module")
def route_pinning(hcfuse_lib) -> bool:
    """Whether the library reads HCFUSE_UP_GATE (HCFUSE_DEV_KNOBS builds): only then it refuses a bad value."""
    model = make_fused_node_model(C=4, H=64, R=8, dtype=np.float16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HCFUSE_UP_GATE", "yes")
        try:
            cuda_session(model, hcfuse_lib, "general", patch)
        except Exception as e:  # onnxruntime's error type for a failed kernel creation
            assert "HCFUSE_UP_GATE must be 0 or 1" in str(e), e
            return True
    return False


def _fused_runs(dtype, C: int, H: int, R: int) -> bool:
    """Whether HcUpGateKernel takes this call (HcUpGateRefusal, for tensors ORT allocates aligned)."""
    return (compute_capability()[0] == 9 and np.dtype(dtype) in DTYPES16 and C == 4 and H % 64 == 0
            and R % 8 == 0)


def _default_fused(dtype, rows: int, C: int, H: int, R: int) -> bool:
    """HcUpGateRoute::kAuto: the fused route where it runs, for bfloat16 at any row count, float16 from 256."""
    return _fused_runs(dtype, C, H, R) and (np.dtype(dtype) == BF16 or rows >= 256)


def _session(model, lib, monkeypatch, route, pinning, default_fused):
    """A general-path session on `route`: pinned by HCFUSE_UP_GATE where the library reads it, else the
    test is skipped unless kAuto takes that route (default_fused)."""
    if not pinning:
        if (route == "fused") != default_fused:
            pytest.skip(f"the library was built without HCFUSE_DEV_KNOBS and kAuto does not take the {route} route here")
        return cuda_session(model, lib, "general", monkeypatch)
    monkeypatch.setenv("HCFUSE_UP_GATE", ROUTES[route])
    try:
        return cuda_session(model, lib, "general", monkeypatch)
    finally:
        monkeypatch.delenv("HCFUSE_UP_GATE", raising=False)


def _run_checking_route(session, feeds, capfd, route, expect_fused):
    """Runs once with HCFUSE_DEBUG's launch line captured; asserts the route it names."""
    capfd.readouterr()
    got = run_bound(session, feeds, device="cuda")
    err = capfd.readouterr().err
    assert "general path" in err, err
    assert (FUSED_LINE in err) == (route == "fused" and expect_fused), err
    return got


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("rows", [17, 129, 300, 1100, 4099])
@pytest.mark.parametrize("dtype", DTYPES16, ids=DTYPE16_IDS)
def test_real_shape_against_reference(hcfuse_lib, route_pinning, monkeypatch, capfd, dtype, rows, route):
    """The real shape in the few-row, mid, prefill and long prefill ranges (the last tile short), the
    route named by the launch line, against the reference on a sample of rows (every row of the last tile)."""
    _require_dtype(dtype)
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    rng = np.random.default_rng([31, rows, DTYPES16.index(dtype)])
    weights = random_weights(**QWEN, dtype=dtype, rng=rng)
    feeds = random_activations((rows,), QWEN["C"], QWEN["H"], dtype, rng, prologue=True)
    model = make_fused_node_model(**QWEN, dtype=dtype, prologue=True, streams_out=True, **QWEN_ATTRS)
    session = _session(model, hcfuse_lib, monkeypatch, route, route_pinning, _default_fused(dtype, rows, **QWEN))
    got = _run_checking_route(session, {**feeds, **weights}, capfd, route, _fused_runs(dtype, **QWEN))
    sample = np.unique(np.concatenate([np.linspace(0, rows - 1, 24).astype(int), np.arange(rows - rows % 128, rows)]))
    ref = _reference({k: v[sample] for k, v in feeds.items()}, weights, QWEN["C"], **QWEN_ATTRS)
    _check(got, ref, dtype, f"up/gate {route} real shape rows={rows}", f"up-gate {route} {dtype.name}", rows=sample)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("dtype", DTYPES16, ids=DTYPE16_IDS)
def test_row_independence_and_determinism(hcfuse_lib, route_pinning, monkeypatch, dtype, route):
    """Inside the prefill range (1024-4095 rows) a row gives the same bits in batches of 1024 ... 1300 rows,
    whichever 128-row tile and CTA it lands in; a second session gives the same bits."""
    _require_dtype(dtype)
    rng = np.random.default_rng([32, DTYPES16.index(dtype)])
    weights = random_weights(**QWEN, dtype=dtype, rng=rng)
    feeds = random_activations((1300,), QWEN["C"], QWEN["H"], dtype, rng, prologue=True)
    model = make_fused_node_model(**QWEN, dtype=dtype, prologue=True, streams_out=True, **QWEN_ATTRS)
    default_fused = _default_fused(dtype, 1300, **QWEN)
    session = _session(model, hcfuse_lib, monkeypatch, route, route_pinning, default_fused)

    def run(lo, hi, s=session):
        return run_bound(s, {**{k: v[lo:hi] for k, v in feeds.items()}, **weights}, device="cuda")

    full = run(0, 1300)
    second = _session(model, hcfuse_lib, monkeypatch, route, route_pinning, default_fused)
    for name, value in run(0, 1300, second).items():
        assert_bitwise_equal(value, full[name], f"{route}: second session {name}")
    for lo, hi in [(0, 1024), (276, 1300), (61, 1150)]:
        for name, value in run(lo, hi).items():
            assert_bitwise_equal(value, full[name][lo:hi], f"{route}: rows [{lo}, {hi}) alone vs in 1300: {name}")


# (C, H, R): one h tile (64) and K one partial step (8); K = 72 (a full step and a partial one); three h
# tiles with K = 104; the real H / 4 with K = 64 (one whole step); H = 320 with K = 24; C = 4 but H not a
# multiple of 64 and C = 3 (the fused kernel refuses both: the unfused route runs)
AWKWARD = [(4, 64, 8), (4, 128, 72), (4, 192, 104), (4, 640, 64), (4, 320, 24), (4, 96, 16), (3, 128, 16)]


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("C,H,R", AWKWARD)
@pytest.mark.parametrize("dtype", DTYPES16, ids=DTYPE16_IDS)
def test_awkward_shapes(hcfuse_lib, route_pinning, monkeypatch, capfd, dtype, C, H, R, route):
    """205 rows (5 x 41 leading dims: two tiles, the second short) against the reference on every row; the
    first 130 rows alone give the same bits (both in the few-row range)."""
    _require_dtype(dtype)
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    rng = np.random.default_rng([33, C, H, R, DTYPES16.index(dtype)])
    weights = random_weights(C, H, R, dtype, rng)
    feeds = random_activations((5, 41), C, H, dtype, rng, prologue=True)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, leading_dims=("a", "b"), prologue=True,
                                  streams_out=True)
    session = _session(model, hcfuse_lib, monkeypatch, route, route_pinning, _default_fused(dtype, 205, C, H, R))
    got = _run_checking_route(session, {**feeds, **weights}, capfd, route, _fused_runs(dtype, C, H, R))
    _check(got, _reference(feeds, weights, C), dtype, f"up/gate {route} C={C} H={H} R={R}",
           f"up-gate {route} awkward {dtype.name}")
    flat = {k: v.reshape(205, -1)[:130].reshape(1, 130, -1) for k, v in feeds.items()}
    for name, value in run_bound(session, {**flat, **weights}, device="cuda").items():
        assert_bitwise_equal(value.reshape(130, -1), got[name].reshape(205, -1)[:130],
                             f"{route} C={C} H={H} R={R}: 130 rows alone vs in 205: {name}")


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("rows", [40, 4099])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_special_up_values(hcfuse_lib, route_pinning, monkeypatch, dtype, rows, route):
    """up columns of NaN, of huge values (+-inf in 16-bit T) and of both signs next to ordinary ones: NaN
    pre_output exactly where an up is NaN, g = 0 or 1 at the infinities (bfloat16's table and its computed
    fallback for NaN pairs), the rest against the reference. float32 runs the unfused route either way."""
    _require_dtype(dtype)
    C, H, R = 4, 256, 16
    rng = np.random.default_rng([34, rows, DTYPES.index(dtype)])
    weights = random_weights(C, H, R, dtype, rng)
    up = weights["up_weight"].astype(np.float32)
    big = float(np.finfo(np.float16 if dtype == np.float16 else np.float32).max) / 8
    up[:, 5] = np.nan                          # branch 0, h = 5: a NaN next to a finite value in its pair
    up[:, H + 17] = big                        # branch 1: up = +-inf or huge
    up[:, 2 * H + 33] = -big                   # branch 2
    up[:, 3 * H + 64:3 * H + 72] = np.nan      # branch 3: 8 NaN columns
    up[::2, 100] = big                         # branch 0, h = 100: huge and ordinary rows of up_weight
    weights["up_weight"] = up.astype(dtype)
    feeds = random_activations((rows,), C, H, dtype, rng, prologue=True)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True)
    session = _session(model, hcfuse_lib, monkeypatch, route, route_pinning, _default_fused(dtype, rows, C, H, R))
    got = run_bound(session, {**feeds, **weights}, device="cuda")
    pre = got["pre_output"].astype(np.float32)
    assert np.isnan(pre[:, 5]).all() and np.isnan(pre[:, 64:72]).all(), "NaN up must give NaN pre_output"
    assert np.isfinite(np.delete(pre, [5, *range(64, 72)], axis=1)).all(), "only the NaN columns may be NaN"
    _check(got, _reference(feeds, weights, C), dtype, f"up/gate {route} special values rows={rows}",
           f"up-gate {route} special {dtype.name}")


@pytest.mark.parametrize("dtype,rows,fused", [(BF16, 40, True), (BF16, 300, True), (np.dtype(np.float16), 40, False),
                                              (np.dtype(np.float16), 300, True), (np.dtype(np.float16), 4096, True),
                                              (np.dtype(np.float32), 4096, False)],
                         ids=["bf16-40", "bf16-300", "fp16-40", "fp16-300", "fp16-4096", "fp32-4096"])
def test_default_route(hcfuse_lib, monkeypatch, capfd, dtype, rows, fused):
    """HcUpGateRoute::kAuto (HCFUSE_UP_GATE unset): fused for bfloat16 in every range, for float16 from the
    mid range (256 rows), never for float32."""
    _require_dtype(dtype)
    monkeypatch.delenv("HCFUSE_UP_GATE", raising=False)
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    C, H, R = 4, 128, 16
    rng = np.random.default_rng([35, rows])
    weights = random_weights(C, H, R, dtype, rng)
    feeds = random_activations((rows,), C, H, dtype, rng, prologue=True)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True)
    session = cuda_session(model, hcfuse_lib, "general", monkeypatch)
    got = _run_checking_route(session, {**feeds, **weights}, capfd, "fused", fused and _fused_runs(dtype, C, H, R))
    _check(got, _reference(feeds, weights, C), dtype, f"up/gate default route rows={rows}",
           f"up-gate default {dtype.name}")


def test_bad_route_value_is_an_error(hcfuse_lib, route_pinning, monkeypatch):
    """HCFUSE_UP_GATE other than 0 or 1 fails the session's creation with a message naming it (HCFUSE_DEV_KNOBS
    builds)."""
    if not route_pinning:
        pytest.skip("the library was built without HCFUSE_DEV_KNOBS (it reads no HCFUSE_UP_GATE)")
    model = make_fused_node_model(C=4, H=64, R=8, dtype=np.float16)
    monkeypatch.setenv("HCFUSE_UP_GATE", "yes")
    with pytest.raises(Exception, match="HCFUSE_UP_GATE must be 0 or 1"):
        cuda_session(model, hcfuse_lib, "general", monkeypatch)
