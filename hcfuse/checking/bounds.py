"""The stated bound of each kernel path against hcfuse.reference, per output element, in scaled ulps.

docs/NUMERICS.md derives these formulas. In short: every path rounds to T at the reference's rounding
points with the same per-element arithmetic, so a path differs from the reference only where it sums
in another fixed order. Those differences are propagated here, to first order, through the reference's
own intermediate values (``hcfuse.reference.hc_lowrank_mix_steps``) to pre_output and post_gate:

- float16 / bfloat16 on the CUDA paths: an fp32 order difference is far below an ulp of T, so it can only
  flip roundings to T. A step whose inputs move by delta moves by delta plus one ulp of T; the flips
  feeding a product (hn into down and inject, hidden into up) add up with random signs, of which the
  bound takes ``FLIP_SIGMAS`` standard deviations;
- float32 (CPU with FMA and a sliced down product; the CUDA general path): each reordered sum differs
  from the reference's sequential sum by the two orders' rounding errors of its partial sums, noise of
  standard deviation about u * sqrt(n * (||terms||^2 / 3 + 2 result^2 / 9)) for n terms (u = 2^-24);
  the bound takes ``SIGMAS`` of it, added in quadrature through the next product. The norm's sum of
  squares (CUDA only) scales a whole branch of hn by a common factor, carried through exactly with the
  worst signs.

The result is compared with ``hcfuse.checking.verification.scaled_ulp`` element by element. The CPU
kernel in float16 and bfloat16 follows the reference's order exactly: bitwise (``is_bitwise``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

PATHS = ("cpu", "cuda-general", "cuda-fast")
# Standard deviations of an fp32 order difference that a float32 bound allows (a maximum over ~10^6
# elements of a Gaussian lies near 5).
SIGMAS = 6.0
# Standard deviations of a sum of rounding flips (16-bit T) that a bound allows.
FLIP_SIGMAS = 3.0
_U = 2.0**-24  # fp32 unit roundoff

_F64 = np.float64


def is_bitwise(path: str, dtype) -> bool:
    """Whether the path claims the reference's exact bits for pre_output and post_gate."""
    _check_path(path)
    return path == "cpu" and np.dtype(dtype).itemsize == 2


def _check_path(path: str) -> None:
    if path not in PATHS:
        raise ValueError(f"bounds: path must be one of {PATHS}; got {path!r}")


def ulp_unit(x, dtype) -> np.ndarray:
    """The ulp of dtype at |x| (the spacing of the binade |x| lies in, subnormal spacing at the
    bottom): the unit scaled_ulp counts in."""
    info = ml_dtypes.finfo(dtype)
    m = np.maximum(np.abs(np.asarray(x, _F64)), np.finfo(_F64).tiny)
    return np.exp2(np.maximum(np.floor(np.log2(m)), info.minexp) - info.nmant)


def _rms(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.sqrt(np.mean(x * x))) if x.size else 0.0


def _floored(x: np.ndarray) -> np.ndarray:
    """|x|, but at least the rms of x: the magnitude a scaled ulp is measured at."""
    return np.maximum(np.abs(x), _rms(x))


def _sigmoid_slope(x: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """max of sigmoid'(y) over |y - x| <= dx."""
    y = np.maximum(np.abs(x) - dx, 0.0)
    s = 1.0 / (1.0 + np.exp(-y))
    return s * (1.0 - s)


def _silu_derivative(z: np.ndarray) -> np.ndarray:
    """d/dz (z * sigmoid(z)), signed (at most 1.0998 in magnitude)."""
    s = 1.0 / (1.0 + np.exp(-z))
    return s * (1.0 + z * (1.0 - s))


def _norm_factor(H: int) -> float:
    """SIGMAS deviations of the relative change of hn when a branch's sum of squares S of H positive
    terms is taken in another order: its partial sums grow as S k / H, so S moves by about
    u * S * sqrt(2 H / 9) (two orders), and hn = S-scaled by 1 / sqrt(S) by half that."""
    return SIGMAS * _U * np.sqrt(2.0 * H / 9.0) / 2.0


def _in_scaled_ulps(delta: np.ndarray, expected: np.ndarray, dtype) -> np.ndarray:
    """A bound on |expected - actual| in scaled ulps of the rounded output: delta (before the last
    rounding) over the unit at max(|expected|, rms), plus one for the two roundings to T."""
    return delta / ulp_unit(_floored(expected), dtype) + 1.0


def output_bounds(path: str, feeds: dict, steps: dict, *, num_branches: int, reduction_scale: float = 1.0,
                  silu_alpha: float = 1.0, gate_div: float = 1.0, gate_mul: float = 1.0, **_ignored) -> dict:
    """Per-element bounds in scaled ulps for pre_output (..., H) and post_gate (..., C) of `path`
    against the reference. feeds: the op's inputs by name; steps: hc_lowrank_mix_steps(**feeds, ...)
    with the same attributes. Zero arrays where the path is bitwise. Other attributes (epsilon) are
    accepted and act through steps."""
    _check_path(path)
    with np.errstate(over="ignore"):  # exp of far-out values: sigmoid slopes of 0, as intended
        return _output_bounds(path, feeds, steps, num_branches, reduction_scale, silu_alpha, gate_div, gate_mul)


def _output_bounds(path, feeds, steps, num_branches, reduction_scale, silu_alpha, gate_div, gate_mul):
    dtype = np.dtype(steps["pre_output"].dtype)
    if path == "cuda-fast" and dtype.itemsize != 2:
        raise ValueError("bounds: the CUDA fast path runs float16 and bfloat16 only")
    lead_pre, lead_gate = steps["pre_output"].shape, steps["post_gate"].shape
    if is_bitwise(path, dtype):
        return {"pre_output": np.zeros(lead_pre), "post_gate": np.zeros(lead_gate)}
    C = num_branches
    f = {k: np.asarray(v).astype(_F64).reshape(-1, np.shape(v)[-1]) for k, v in steps.items()}
    rows, K = f["hn"].shape
    H = K // C
    w = {k: np.asarray(feeds[k]).astype(_F64) for k in ("down_weight", "up_weight", "inject_weight")}
    if dtype.itemsize == 2:
        d_pre, d_gate = _flip_propagation(f, w, dtype, C, H, reduction_scale, silu_alpha, gate_div, gate_mul)
    else:
        d_pre, d_gate = _order_propagation(f, w, C, H, reorders_norm=path != "cpu", rs=reduction_scale,
                                           alpha=silu_alpha, gate_div=gate_div, gate_mul=gate_mul)
    return {"pre_output": _in_scaled_ulps(d_pre, f["pre_output"], dtype).reshape(lead_pre),
            "post_gate": _in_scaled_ulps(d_gate, f["post_gate"], dtype).reshape(lead_gate)}


def _flip_propagation(f, w, dtype, C, H, rs, alpha, gate_div, gate_mul):
    """16-bit T: an fp32 order difference only flips roundings to T. A value that its inputs move by
    delta may move by delta plus one ulp of T; flips feeding a product add up with random signs
    (FLIP_SIGMAS standard deviations of their sum, every input flipped)."""
    rows, K = f["hn"].shape
    ulp = lambda x: ulp_unit(x, dtype)  # noqa: E731
    # hn: the norm's order moves a branch's hn by the relative _norm_factor(H), which flips a rounding
    # of hn by one ulp with probability at most that over the smallest relative ulp of T
    p_hn = min(1.0, _norm_factor(H) * 2.0 ** (ml_dtypes.finfo(dtype).nmant + 1))
    d_hn = ulp(f["hn"])

    def through(x_ulps, weight, result):
        """A product of hn: its flips with random signs, then the result's own flip (one ulp at its
        magnitude) and the product's fp32 order difference (below one ulp at the result's rms)."""
        spread = FLIP_SIGMAS * np.sqrt(p_hn * (x_ulps**2) @ (weight**2))
        return spread + ulp(result) + ulp(_rms(result))

    d_down = through(d_hn, w["down_weight"], f["down"])
    d_z = abs(alpha) * d_down + ulp(np.abs(f["Z"]) + abs(alpha) * d_down)
    d_sg_exact = _sigmoid_slope(f["Z"], d_z) * d_z
    d_sg = d_sg_exact + ulp(np.abs(f["SG"]) + d_sg_exact)
    d_hidden_exact = np.abs(f["SG"]) * d_z + (np.abs(f["Z"]) + d_z) * d_sg
    d_hidden = d_hidden_exact + ulp(np.abs(f["hidden"]) + d_hidden_exact)
    d_up_exact = FLIP_SIGMAS * np.sqrt((d_hidden**2) @ (w["up_weight"] ** 2))
    d_up = d_up_exact + ulp(np.abs(f["up"]) + d_up_exact)
    up, g, hn = (f[k].reshape(rows, C, H) for k in ("up", "g", "hn"))
    d_up = d_up.reshape(rows, C, H)
    d_g_exact = _sigmoid_slope(up, d_up) * d_up
    d_g = d_g_exact + ulp(np.abs(g) + d_g_exact)
    d_hn = d_hn.reshape(rows, C, H)
    mix = np.abs(hn) * d_g + (np.abs(g) + d_g) * d_hn + (C + 1) * _U * np.abs(hn * g)
    d_pre = abs(rs) * mix.sum(axis=1)
    d_inject = through(ulp(f["hn"]), w["inject_weight"], f["inject"])
    return d_pre, _post_gate_delta(f["inject"], d_inject, gate_div, gate_mul, dtype)


def _post_gate_delta(inject, d_inject, gate_div, gate_mul, dtype):
    """How far post_gate = T(T(sigmoid(T(inject / gate_div))) * gate_mul) may move, before its last
    rounding, when inject moves by d_inject: the gate logit by d_inject / |gate_div| plus a flip of its
    rounding (one ulp of T); the sigmoid by its slope times that, its fp32 roundings and a flip of its
    own rounding; post_gate by |gate_mul| times the sigmoid's move (its own flip: _in_scaled_ulps)."""
    ulp = lambda x: ulp_unit(x, dtype)  # noqa: E731
    x = inject / gate_div
    dx_exact = d_inject / abs(gate_div)
    dx = dx_exact + ulp(np.abs(x) + dx_exact)
    sigmoid = 1.0 / (1.0 + np.exp(-x))
    d_sigmoid_exact = _sigmoid_slope(x, dx) * dx + 3 * _U * sigmoid
    d_sigmoid = d_sigmoid_exact + ulp(sigmoid + d_sigmoid_exact)
    return abs(gate_mul) * d_sigmoid


def _order_noise(x: np.ndarray, w: np.ndarray, result: np.ndarray) -> np.ndarray:
    """SIGMAS standard deviations of the difference between two fp32 orders of result = x @ w over n
    terms t_k: each order rounds its partial sums s_k (error up to u |s_k|, standard deviation u |s_k| / sqrt(3)),
    and sum_k s_k^2 is about n (||t||^2 / 2 + result^2 / 3) (a random walk to result)."""
    n = x.shape[-1]
    t_norm2 = (x * x) @ (w * w)
    return SIGMAS * _U * np.sqrt(n * (t_norm2 / 3.0 + 2.0 * result * result / 9.0))


def _order_propagation(f, w, C, H, *, reorders_norm, rs, alpha, gate_div, gate_mul):
    """float32: reordered sums as noise of SIGMAS standard deviations, independent across elements
    (added in quadrature through the next product); the norm's common factor per (row, branch) exactly."""
    rows, K = f["hn"].shape
    hn = f["hn"]
    hn_c = hn.reshape(rows, C, H)
    down_w = w["down_weight"].reshape(C, H, -1)
    up_w, inject_w = w["up_weight"], w["inject_weight"].reshape(C, H, C)
    # the norm's order (CUDA) scales a whole branch of hn: relative e_hn, the same for every feature
    e_hn = _norm_factor(H) + 2 * _U if reorders_norm else 0.0

    # down -> Z -> hidden: independent order noise of each down column
    d_down_noise = _order_noise(hn, w["down_weight"], f["down"]) + 2 * _U * np.abs(f["down"])
    gain = alpha * _silu_derivative(f["Z"])  # d hidden / d down
    d_hidden_noise = np.abs(gain) * d_down_noise + 5 * _U * np.abs(f["hidden"])  # + SG and hidden rounding flips
    # up: that noise through up_weight in quadrature, plus up's own order
    d_up_own = _order_noise(f["hidden"], up_w, f["up"]) + _U * np.abs(f["up"])
    d_up_noise = np.sqrt((d_hidden_noise**2) @ (up_w**2)) + d_up_own
    # the hn factor of branch c moves down by e * (branch c's share of down); through hidden and up exactly,
    # the branches' factors with the worst signs
    d_up_factor = np.zeros_like(f["up"])
    if e_hn:
        down_parts = np.einsum("rch,chn->rcn", hn_c, down_w)
        d_up_factor = e_hn * sum(np.abs((gain * down_parts[:, c]) @ up_w) for c in range(C))
    up_c, g_c = f["up"].reshape(rows, C, H), f["g"].reshape(rows, C, H)
    d_up = (d_up_noise + d_up_factor).reshape(rows, C, H)
    slope = _sigmoid_slope(up_c, d_up)
    # pre_output's noise: every branch's g at feature h reads the same hidden values, so their noise is
    # summed through sum_c hn_c * slope_c * up_weight[:, c, h] before the quadrature over R
    a_c = hn_c * slope
    up_w_c = up_w.reshape(-1, C, H)
    hidden_var = d_hidden_noise**2
    var = sum(a_c[:, c] * a_c[:, d] * (hidden_var @ (up_w_c[:, c] * up_w_c[:, d])) for c in range(C) for d in range(C))
    var = var + ((a_c * d_up_own.reshape(rows, C, H)) ** 2).sum(axis=1)
    mix = (np.sqrt(np.maximum(var, 0.0))
           + (np.abs(hn_c) * (slope * d_up_factor.reshape(rows, C, H) + 2 * _U * g_c)).sum(axis=1)
           + (np.abs(g_c * hn_c) * (e_hn + (C + 2) * _U)).sum(axis=1))
    d_pre = abs(rs) * mix

    inject_parts = np.einsum("rch,chq->rcq", hn_c, inject_w)
    d_inject = (_order_noise(hn, w["inject_weight"], f["inject"]) + e_hn * np.abs(inject_parts).sum(axis=1)
                + _U * np.abs(f["inject"]))
    return d_pre, _post_gate_delta(f["inject"], d_inject, gate_div, gate_mul, np.float32)
