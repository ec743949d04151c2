"""The scaling-law fitter and the compute box (the seed's piece F5).

:func:`fit_scaling_law` fits the Chinchilla form ``L(N, D) = E + A / N**alpha + B / D**beta`` to points
``(n_params, tokens, loss)`` the way its replication recommends (Besiroglu et al. 2024, "Chinchilla Scaling: A
replication attempt"): in log space, ``log L = LSE(a - alpha log N, b - beta log D, e)`` with ``A = exp(a)``,
``B = exp(b)``, ``E = exp(e)``; the Huber loss (delta 1e-3) of the residuals in log loss, summed, not averaged;
a local minimiser from a grid of starting points. The grid is Hoffmann et al.'s (``alpha, beta`` in 0..2, ``e`` in
-1..1, ``a, b`` in 0..25): every grid point's objective is evaluated at once (numpy), and the minimiser runs from the
best :data:`STARTS` of them.

Two minimisers, named in the fit (``fitter``, recorded in ``scaling_fitted`` since format 1.5 so replay refits with the
one that was used): ``"lm"`` (the default), damped Newton steps (Levenberg-Marquardt on the exact Hessian, with a
line search over eight step lengths) run on every problem of a batch at once in numpy: the starts of one fit, the
bootstrap's refits, the leave-one-out refits, each one vectorised solve; and ``"lbfgs"``, scipy's L-BFGS-B one problem
at a time, the fitter of every journal before 1.5 (absent field). On the scaling preset's six points the whole F5
(fit, 200 bootstrap refits, leave-one-out) took 1.7 s of CPU with ``"lm"`` against 13.5 s with ``"lbfgs"`` (the same
machine, one after the other), reaching the same objective or a lower one (``tests/unit/ladder/test_scaling.py``).

What it cannot do: with a small ladder, E (the irreducible loss) is often not identifiable (a larger A with a
smaller E fits as well); and a prediction far beyond the ladder's sizes is an extrapolation, a guess with an
interval. :meth:`ScalingFit.interval` is a seeded bootstrap (resampled points, refit from the full fit, plus a
resampled log residual), so replay reproduces it bit for bit on the same platform.

:class:`ComputeBox` chooses the headline run: among candidate sizes (their model FLOPs per token from the project's
FLOP accounting, not 6N alone) and token counts, the feasible one with the lowest predicted loss, where feasible
means within the FLOP budget, within the wall-clock budget at the MFU measured on the earlier rungs (never the
datasheet), and within device memory for weights, gradients and optimizer state; it says which constraint binds.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["ScalingFit", "fit_scaling_law", "fit_warnings", "ComputeBox", "BoxChoice", "Candidate", "HUBER_DELTA",
           "STARTS", "FITTERS", "PLAUSIBLE"]

HUBER_DELTA = 1e-3
#: L-BFGS runs from this many of the grid's best starting points
STARTS = 24
#: the minimisers a fit may name (see the module doc); the first is the default
FITTERS = ("lm", "lbfgs")
#: the batched minimiser's bound on its iterations (a problem whose minimum lies at infinity, E -> 0 on a small
#: ladder, creeps towards it and stops here)
LM_MAXIT = 1000
#: where a fitted law is taken at face value (:func:`fit_warnings`): E at least this fraction of the lowest loss
#: measured and below it; each exponent in this range (the grid Hoffmann et al. start from spans 0 to 2; published
#: fits sit near 0.3); E within this factor of the data's true entropy rate, where the data has a known one
PLAUSIBLE = {"E_min_fraction": 0.05, "exponent": (0.05, 2.0), "entropy_factor": 2.0}
_ALPHAS = (4.0, 2.0, 1.0, 0.5, 0.25, 0.125, 1 / 16, 1 / 64)  # the line search's step lengths, tried at once
_GRID = {"alpha": [0.0, 0.5, 1.0, 1.5, 2.0], "beta": [0.0, 0.5, 1.0, 1.5, 2.0], "e": [-1.0, -0.5, 0.0, 0.5, 1.0],
         "a": [0.0, 5.0, 10.0, 15.0, 20.0, 25.0], "b": [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]}


def _exp(t: float) -> float:
    """``math.exp``, infinite where the value is past a float (a refit on a few resampled points can get there)."""
    try:
        return math.exp(t)
    except OverflowError:
        return math.inf


def _np():
    try:
        import numpy as np
        import scipy.optimize  # noqa: F401
    except ImportError:
        from trainledger.journal.errors import UsageError

        raise UsageError("scaling-law fits need numpy and scipy: pip install 'trainledger[scaling]'") from None
    return np


def _objective(theta, x, y, logl):
    """Summed Huber loss of log-space residuals, and its gradient (theta = a, b, e, alpha, beta)."""
    np = _np()
    a, b, e, alpha, beta = theta
    t = np.stack([a - alpha * x, b - beta * y, np.full_like(x, e)])
    m = t.max(axis=0)
    w = np.exp(t - m)
    s = w.sum(axis=0)
    r = m + np.log(s) - logl
    p = w / s
    d = HUBER_DELTA
    small = np.abs(r) <= d
    f = np.where(small, 0.5 * r * r, d * (np.abs(r) - 0.5 * d)).sum()
    g = np.where(small, r, d * np.sign(r))
    grad = np.array([(g * p[0]).sum(), (g * p[1]).sum(), (g * p[2]).sum(), -(g * p[0] * x).sum(),
                     -(g * p[1] * y).sum()])
    return f, grad


def _grid_values(x, y, logl):
    """The objective at every grid point at once (in chunks of points, so memory stays bounded): (grid, values)."""
    np = _np()
    grid = np.array(list(itertools.product(_GRID["a"], _GRID["b"], _GRID["e"], _GRID["alpha"], _GRID["beta"])))
    a, b, e, al, be = (grid[:, i:i + 1] for i in range(5))
    vals = np.zeros(len(grid))
    d = HUBER_DELTA
    for s in range(0, len(x), 512):
        xs, ys, ls = x[None, s:s + 512], y[None, s:s + 512], logl[None, s:s + 512]
        t0, t1 = a - al * xs, b - be * ys
        t2 = np.broadcast_to(e, t0.shape)
        m = np.maximum(np.maximum(t0, t1), t2)
        r = m + np.log(np.exp(t0 - m) + np.exp(t1 - m) + np.exp(t2 - m)) - ls
        vals += np.where(np.abs(r) <= d, 0.5 * r * r, d * (np.abs(r) - 0.5 * d)).sum(axis=1)
    return grid, vals


def _batch_parts(theta, x, y, logl, *, hessian: bool = True):
    """For a batch of problems (theta (B, 5); x, y, logl (B, n)): the objective (B,), and with ``hessian`` its
    gradient (B, 5) and exact Hessian (B, 5, 5)."""
    np = _np()
    a, b, e, al, be = (theta[:, i:i + 1] for i in range(5))
    t0 = a - al * x
    t1 = b - be * y
    t2 = np.broadcast_to(e, t0.shape)
    m = np.maximum(np.maximum(t0, t1), t2)
    w0, w1, w2 = np.exp(t0 - m), np.exp(t1 - m), np.exp(t2 - m)
    s = w0 + w1 + w2
    r = m + np.log(s) - logl
    d = HUBER_DELTA
    ar = np.abs(r)
    small = ar <= d
    f = np.where(small, 0.5 * r * r, d * (ar - 0.5 * d)).sum(axis=1)
    if not hessian:
        return f, None, None
    p0, p1, p2 = w0 / s, w1 / s, w2 / s
    h1 = np.where(small, r, d * np.sign(r))  # the Huber loss's first derivative at each residual, and its second
    h2 = small.astype(float)
    jac = np.stack([p0, p1, p2, -p0 * x, -p1 * y], axis=-1)  # d r / d theta at each point
    g = np.einsum("bn,bnk->bk", h1, jac)
    # d2 r / d theta2 = D' diag(p) D - jac jac' (D: d(t0, t1, t2) / d theta), so the Hessian is
    # sum (h2 - h1) jac jac' + h1 D' diag(p) D, the second term written out
    hess = np.einsum("bn,bnk,bnl->bkl", h2 - h1, jac, jac)
    hess[:, 0, 0] += (h1 * p0).sum(1)
    hess[:, 1, 1] += (h1 * p1).sum(1)
    hess[:, 2, 2] += (h1 * p2).sum(1)
    c03, c14 = -(h1 * p0 * x).sum(1), -(h1 * p1 * y).sum(1)
    hess[:, 0, 3] += c03
    hess[:, 3, 0] += c03
    hess[:, 1, 4] += c14
    hess[:, 4, 1] += c14
    hess[:, 3, 3] += (h1 * p0 * x * x).sum(1)
    hess[:, 4, 4] += (h1 * p1 * y * y).sum(1)
    return f, g, hess


def _lm_batch(theta0, x, y, logl, *, tol: float = 1e-15):
    """Minimise the objective of every problem of a batch at once: theta0 (B, 5) the starts, x, y, logl (B, n) or
    (n,) for one set of points shared by all; return (theta (B, 5), objective (B,)).

    Each iteration solves the damped Newton system (H + lam diag|H|) step = -g of every live problem, tries eight
    lengths of that step at once and keeps the best if it lowers the objective (the damping falls after a long
    step and rises after a short or failed one). The points are centred first (a - alpha mean(x) is fitted, which
    conditions the system far better) and the answer moved back. A problem stops after four iterations in a row
    that lower its objective by at most ``tol`` of it, or at :data:`LM_MAXIT`."""
    np = _np()
    B = len(theta0)
    x, y, logl = (np.broadcast_to(v, (B, v.shape[-1])) for v in (x, y, logl))
    xm, ym = x.mean(1), y.mean(1)
    xc, yc = x - xm[:, None], y - ym[:, None]
    th = np.array(theta0, dtype=float)
    th[:, 0] -= th[:, 3] * xm
    th[:, 1] -= th[:, 4] * ym
    f, g, hess = _batch_parts(th, xc, yc, logl)
    lam = np.full(B, 1e-3)
    live = np.ones(B, bool)
    quiet = np.zeros(B, int)
    alphas = np.array(_ALPHAS)
    k_n = len(alphas)
    eye = np.eye(5)
    for _ in range(LM_MAXIT):
        idx = np.flatnonzero(live)
        if not len(idx):
            break
        m = len(idx)
        hl, gl, fl, ll = hess[idx], g[idx], f[idx], lam[idx]
        dg = np.abs(np.diagonal(hl, axis1=1, axis2=2))
        dg = np.maximum(dg, 1e-9 * np.maximum(dg.max(1, keepdims=True), 1e-30))
        with np.errstate(all="ignore"):
            step = -np.linalg.solve(hl + ll[:, None, None] * (dg[:, :, None] * eye), gl[..., None])[..., 0]
        bad = ~np.isfinite(step).all(1)
        step[bad] = -(gl[bad] / (ll[bad, None] * dg[bad]))  # a singular system: a short gradient step
        cands = th[idx][:, None, :] + alphas[None, :, None] * step[:, None, :]
        with np.errstate(all="ignore"):
            fc = _batch_parts(cands.reshape(m * k_n, 5), np.repeat(xc[idx], k_n, 0), np.repeat(yc[idx], k_n, 0),
                              np.repeat(logl[idx], k_n, 0), hessian=False)[0].reshape(m, k_n)
        fc[~np.isfinite(fc)] = np.inf
        k = np.argmin(fc, axis=1)
        fb = fc[np.arange(m), k]
        ok = fb < fl
        acc = idx[ok]
        if len(acc):
            new = cands[np.arange(m), k][ok]
            th[acc] = new
            f[acc], g[acc], hess[acc] = _batch_parts(new, xc[acc], yc[acc], logl[acc])
        a = alphas[k]
        lam[idx] = np.clip(np.where(ok, np.where(a >= 1, ll / 4, np.where(a <= 0.25, ll * 4, ll)), ll * 10),
                           1e-15, 1e30)
        still = ~ok | (fl - fb <= tol * np.maximum(fl, 1e-300))
        quiet[idx] = np.where(still, quiet[idx] + 1, 0)
        live[idx[(quiet[idx] >= 4) & (ok | (lam[idx] > 1e12))]] = False
    th[:, 0] += th[:, 3] * xm
    th[:, 1] += th[:, 4] * ym
    return th, _batch_parts(th, x, y, logl, hessian=False)[0]


def _lbfgs(theta0, x, y, logl):
    from scipy.optimize import minimize

    res = minimize(_objective, theta0, args=(x, y, logl), jac=True, method="L-BFGS-B",
                   options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12})
    return res.x, float(res.fun)


@dataclasses.dataclass(frozen=True)
class ScalingFit:
    """A fitted law. ``params``: E, A, B, alpha, beta; ``theta``: (a, b, e, alpha, beta) as fitted."""

    theta: tuple[float, float, float, float, float]
    objective: float
    points: tuple[tuple[float, float, float], ...]
    seed: int = 0
    boot: int = 200
    fitter: str = FITTERS[0]

    @property
    def params(self) -> dict[str, float]:
        a, b, e, alpha, beta = self.theta
        return {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": alpha, "beta": beta}

    def predict(self, n_params: float, tokens: float) -> float:
        p = self.params
        return p["E"] + p["A"] / n_params ** p["alpha"] + p["B"] / tokens ** p["beta"]

    def compute_optimal(self, flops: float) -> tuple[float, float]:
        """``(n_params, tokens)`` minimising the law on the ``6 N D = flops`` frontier (Hoffmann et al., eq. 4)."""
        p = self.params
        al, be = p["alpha"], p["beta"]
        if al <= 0 or be <= 0:
            raise ValueError(f"no compute-optimal frontier: alpha {al:.3g}, beta {be:.3g} (the law does not fall "
                             "with both size and tokens)")
        g = (al * p["A"] / (be * p["B"])) ** (1 / (al + be))
        n = g * (flops / 6) ** (be / (al + be))
        return n, flops / (6 * n)

    def residuals(self) -> list[float]:
        """log(predicted) - log(measured) at every point."""
        return [math.log(self.predict(n, d)) - math.log(ls) for n, d, ls in self.points]

    def _boot_thetas(self) -> list[Any]:
        cached = _BOOT.get(self)
        if cached is not None:
            return cached
        np = _np()
        x, y, logl = _arrays(self.points)
        rng = np.random.default_rng(self.seed)
        draws = [rng.integers(0, len(x), len(x)) for _ in range(self.boot)]
        if self.fitter == "lm":
            ix = np.array(draws)
            out = list(_lm_batch(np.tile(np.array(self.theta), (self.boot, 1)), x[ix], y[ix], logl[ix])[0])
        else:
            out = [_lbfgs(np.array(self.theta), x[idx], y[idx], logl[idx])[0] for idx in draws]
        _BOOT[self] = out
        return out

    def interval(self, n_params: float, tokens: float, level: float = 0.9) -> tuple[float, float]:
        """A seeded bootstrap prediction interval: the law refitted on resampled points, times a resampled
        residual (so it covers a single run's noise, not only the law's)."""
        np = _np()
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        res = np.array(self.residuals())
        rng = np.random.default_rng(self.seed + 1)
        preds = []
        for th in self._boot_thetas():
            a, b, e, al, be = th
            try:
                law = math.exp(e) + math.exp(a) / n_params ** al + math.exp(b) / tokens ** be
            except OverflowError:  # a refit on a few resampled points can put A or B past a float: the log form
                law = _exp(e) + _exp(a - al * math.log(n_params)) + _exp(b - be * math.log(tokens))
            preds.append(law * math.exp(-res[rng.integers(0, len(res))]))
        lo, hi = np.quantile(np.array(preds), [(1 - level) / 2, 1 - (1 - level) / 2])
        return float(lo), float(hi)

    def loo_error(self) -> float:
        """Leave-one-out: the mean absolute relative error of each point's loss predicted by a fit of the others
        (each refitted from the full fit)."""
        np = _np()
        x, y, logl = _arrays(self.points)
        n = len(x)
        keeps = [np.arange(n) != i for i in range(n)]
        if self.fitter == "lm":
            ix = np.array([np.flatnonzero(k) for k in keeps])
            thetas = list(_lm_batch(np.tile(np.array(self.theta), (n, 1)), x[ix], y[ix], logl[ix])[0])
        else:
            thetas = [_lbfgs(np.array(self.theta), x[k], y[k], logl[k])[0] for k in keeps]
        errs = []
        for i, th in enumerate(thetas):
            a, b, e, al, be = th
            pred = _exp(e) + _exp(a - al * x[i]) + _exp(b - be * y[i])
            errs.append(abs(pred - math.exp(logl[i])) / math.exp(logl[i]))
        return float(np.mean(errs))

    def warnings(self, entropy_rate: float | None = None) -> list[str]:
        """What makes this fit's parameters doubtful (:func:`fit_warnings`); empty when none."""
        return fit_warnings(self.params, self.points, entropy_rate)

    def to_dict(self) -> dict[str, Any]:
        return {"params": self.params, "theta": list(self.theta), "objective": self.objective,
                "points": [list(p) for p in self.points], "seed": self.seed, "boot": self.boot, "fitter": self.fitter}


_BOOT: dict[ScalingFit, list[Any]] = {}


def fit_warnings(params: dict[str, float], points: Sequence[Sequence[float]],
                 entropy_rate: float | None = None) -> list[str]:
    """One line per reason a fitted law's parameters are not to be taken at face value (:data:`PLAUSIBLE`), in a
    fixed order; empty when none. A pure function of the law, its points and the data's entropy rate, so replay
    recomputes it from the signed ``scaling_fitted``.

    - E under 5% of the lowest loss measured: the irreducible loss is not identified; the minimiser drove it
      towards 0 and a power-law term with a small exponent carries the floor instead (E = 8.4e-13 with
      beta = 0.033 on the scaling preset).
    - E at or above the lowest loss measured: the law says a measured loss is below its own floor.
    - an exponent under 0.05 (a term that barely falls, acting as a constant) or over 2 (beyond the grid the fit
      starts from; no published fit is near it).
    - E off the data's true entropy rate by more than a factor of 2, where the data has a known one.
    """
    out: list[str] = []
    try:
        e = float(params["E"])
        losses = [float(p[2]) for p in points]
    except (KeyError, TypeError, ValueError, IndexError):
        return ["the fit's parameters or points are not numbers: nothing can be said of them"]
    lowest = min(losses) if losses else math.nan
    frac = PLAUSIBLE["E_min_fraction"]
    if not math.isfinite(e):
        out.append(f"E = {e!r} is not a finite number")
    elif math.isfinite(lowest) and e < frac * lowest:
        out.append(f"E = {e:.3g} is under {frac:.0%} of the lowest loss measured ({lowest:.4g}): the irreducible loss "
                   "is not identified (a power-law term carries the floor instead); read E, and predictions far "
                   "beyond the points, as unreliable")
    elif math.isfinite(lowest) and e >= lowest:
        out.append(f"E = {e:.4g} is at or above the lowest loss measured ({lowest:.4g}): the law puts a measured "
                   "loss below its own floor")
    lo, hi = PLAUSIBLE["exponent"]
    for name in ("alpha", "beta"):
        v = params.get(name)
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            out.append(f"{name} = {v!r} is not a finite number")
        elif v < lo:
            out.append(f"{name} = {v:.3g} is under {lo}: its term barely falls and acts as a constant (what it "
                       f"carries belongs to E)")
        elif v > hi:
            out.append(f"{name} = {v:.3g} is over {hi:g}: beyond the range the fit starts from and any published fit")
    if entropy_rate is not None and math.isfinite(entropy_rate) and entropy_rate > 0 and e > 0:
        k = PLAUSIBLE["entropy_factor"]
        if not entropy_rate / k <= e <= entropy_rate * k:
            out.append(f"E = {e:.3g} is not within a factor of {k:g} of the data's true entropy rate "
                       f"({entropy_rate:.4g} nats)")
    return out


def _arrays(points):
    np = _np()
    arr = np.array(points, dtype=float)
    return np.log(arr[:, 0]), np.log(arr[:, 1]), np.log(arr[:, 2])


def _check(points: Sequence[Sequence[float]]) -> tuple[tuple[float, float, float], ...]:
    out = []
    for i, p in enumerate(points):
        if len(p) != 3:
            raise ValueError(f"point {i}: expected (n_params, tokens, loss), got {len(p)} values")
        n, d, ls = (float(v) for v in p)
        if not all(math.isfinite(v) and v > 0 for v in (n, d, ls)):
            raise ValueError(f"point {i}: n_params, tokens and loss must be positive finite numbers, got {p}")
        out.append((n, d, ls))
    if len(out) < 5:
        raise ValueError(f"{len(out)} points cannot determine the law's 5 parameters (E, A, B, alpha, beta): "
                         "give at least 5")
    return tuple(out)


def fit_scaling_law(points: Sequence[Sequence[float]], *, seed: int = 0, boot: int = 200,
                    fitter: str = FITTERS[0]) -> ScalingFit:
    """Fit ``L(N, D) = E + A/N^alpha + B/D^beta`` to ``(n_params, tokens, loss)`` points (see the module doc).
    ``seed`` and ``boot`` fix the bootstrap behind :meth:`ScalingFit.interval`; ``fitter`` is one of
    :data:`FITTERS`."""
    np = _np()
    pts = _check(points)
    if not isinstance(boot, int) or not 1 <= boot <= 100_000:
        raise ValueError(f"boot must be an integer from 1 to 100000, got {boot!r}")
    if fitter not in FITTERS:
        raise ValueError(f"fitter {fitter!r} is not one of {', '.join(FITTERS)}")
    x, y, logl = _arrays(pts)
    grid, vals = _grid_values(x, y, logl)
    order = np.argsort(vals, kind="stable")[:STARTS]
    if fitter == "lm":
        thetas, fs = _lm_batch(grid[order], x, y, logl)
        results = [(thetas[j], float(fs[j])) for j in range(len(order))]
    else:
        results = [_lbfgs(grid[i].copy(), x, y, logl) for i in order]
    best_theta, best = None, math.inf
    for th, f in results:
        if f < best - 1e-15:
            best_theta, best = th, f
    return ScalingFit(theta=tuple(float(v) for v in best_theta), objective=best, points=pts, seed=seed, boot=boot,
                      fitter=fitter)


# ---------------------------------------------------------------- the compute box

@dataclasses.dataclass(frozen=True)
class Candidate:
    """A model size the box may choose: its parameters and its model FLOPs per token (forward and backward, from
    the project's FLOP accounting: 6N plus attention)."""

    name: str
    n_params: int
    flops_per_token: float

    def __post_init__(self) -> None:  # a candidate read back from a journal may say anything
        if not isinstance(self.name, str) or not isinstance(self.n_params, int) or self.n_params < 1 or not (
                isinstance(self.flops_per_token, (int, float)) and math.isfinite(self.flops_per_token)
                and self.flops_per_token > 0):
            raise ValueError(f"candidate {self.name!r}: needs a name, n_params >= 1 and positive flops_per_token")


@dataclasses.dataclass(frozen=True)
class BoxChoice:
    candidate: Candidate
    tokens: int
    predicted_loss: float
    flops: float
    wall_s: float
    memory_bytes: float
    binding: str  # flops | wall_clock | memory
    usage: dict[str, float]  # constraint -> used / limit at the choice

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": dataclasses.asdict(self.candidate), "tokens": self.tokens,
                "predicted_loss": self.predicted_loss, "flops": self.flops, "wall_s": self.wall_s,
                "memory_bytes": self.memory_bytes, "binding": self.binding, "usage": self.usage}


@dataclasses.dataclass(frozen=True)
class ComputeBox:
    """The headline run's budget. ``measured_mfu``: the MFU measured on the earlier rungs (what the wall-clock
    budget is held to); ``bytes_per_param``: weights, gradients and optimizer state per parameter (AdamW in fp32:
    4 + 4 + 8 = 16)."""

    max_flops: float
    max_wall_s: float
    devices: int
    peak_flops_per_sec: float
    memory_bytes_per_device: float
    measured_mfu: float
    bytes_per_param: float = 16.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"ComputeBox.{f.name} must be a positive finite number, got {v!r}")
        if self.measured_mfu > 1:
            raise ValueError(f"ComputeBox.measured_mfu is a fraction of the peak, got {self.measured_mfu}")

    def usage(self, c: Candidate, tokens: float) -> dict[str, float]:
        flops = c.flops_per_token * tokens
        return {"flops": flops / self.max_flops,
                "wall_clock": flops / (self.devices * self.peak_flops_per_sec * self.measured_mfu) / self.max_wall_s,
                "memory": c.n_params * self.bytes_per_param / (self.memory_bytes_per_device * self.devices)}

    def choose(self, fit: ScalingFit, candidates: Sequence[Candidate], *, token_steps: int = 64,
               min_tokens: int = 1) -> BoxChoice:
        """The feasible ``(candidate, tokens)`` with the lowest predicted loss. For each candidate the most tokens
        the budgets allow is tried, and ``token_steps`` geometric steps below it (fewer tokens never lowers the
        predicted loss of a law with beta > 0, but a law fitted with beta <= 0 is not trusted to say so). Raises
        ``ValueError`` when nothing fits (every candidate too big for the memory, or the budgets below
        ``min_tokens``)."""
        if not isinstance(min_tokens, int) or min_tokens < 1:
            raise ValueError(f"min_tokens must be a positive integer, got {min_tokens!r}")
        best: BoxChoice | None = None
        for c in candidates:
            u = self.usage(c, 1.0)
            if u["memory"] > 1:
                continue
            cap = math.floor(1 / max(u["flops"], u["wall_clock"]))
            if cap < min_tokens:
                continue
            for k in range(token_steps + 1):
                d = max(min_tokens, int(cap * (min_tokens / cap) ** (k / token_steps)))
                loss = fit.predict(c.n_params, d)
                if best is None or loss < best.predicted_loss - 1e-12:
                    use = self.usage(c, d)
                    best = BoxChoice(candidate=c, tokens=d, predicted_loss=loss, flops=c.flops_per_token * d,
                                     wall_s=use["wall_clock"] * self.max_wall_s,
                                     memory_bytes=c.n_params * self.bytes_per_param, usage=use, binding="")
        if best is None:
            raise ValueError("nothing fits in the compute box: every candidate needs more memory than the devices "
                             "have, or the budgets allow fewer tokens than min_tokens")
        # What binds: memory, when a candidate it excluded would have predicted a lower loss within the FLOP and
        # wall-clock budgets; otherwise whichever of those two stops the tokens.
        for c in candidates:
            u = self.usage(c, 1.0)
            if u["memory"] > 1:
                cap = math.floor(1 / max(u["flops"], u["wall_clock"]))
                if cap >= min_tokens and fit.predict(c.n_params, cap) < best.predicted_loss - 1e-12:
                    return dataclasses.replace(best, binding="memory")
        use = best.usage
        return dataclasses.replace(best, binding="flops" if use["flops"] >= use["wall_clock"] else "wall_clock")
