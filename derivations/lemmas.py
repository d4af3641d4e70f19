"""The bound lemmas: statements, assumptions, symbolic constants and proofs.

Region and assumptions (symbols below):

- ``R``: every column of X has Euclidean norm <= R (so ``||X||_2 <= sqrt(n) R``)
- ``sigma``: ``||X||_2 <= sigma`` (implied by sigma = sqrt(n) R, the default)
- ``rho``: every row residual ``||f_i - b_i|| <= rho`` (implied by rho = sqrt 2, the default:
  two points of the simplex)
- ``omega``: ``||W_h||_2 <= omega`` for every head; ``mu``: ``||u_h|| <= mu``
- ``H`` heads, ``n`` tokens; rows of every attention map B_h in the simplex
- ``gamma`` = min Gamma, ``gamma_max`` = max Gamma (regulariser weights)
- output variant: ``||W_V,h||_2 <= omega_V`` and every row of B_h has norm <= beta

The constants hold for any d: d enters only through omega, R and mu.
None of them has the ``exp(O(R^2))`` factor of the paper family: the
softmax derivatives are bounded by constants (c1, c2, c3 below) whatever the
logits, so the only growth is polynomial in sqrt(n), R, omega and mu.

Proof skeleton (one head; several heads add). Write ``dS = dS[V]``,
``d2S = 2 V^T W V``; rows ``s_i``, ``f_i``, ``r_i = f_i - b_i``.

1. ``||dS||_F <= (||V^T W X||_F + ||X^T W V||_F + ||1 u^T V||_F)
   <= (2 omega sigma + sqrt(n) mu) ||V||_F = J_S ||V||_F``.
2. ``||d2S||_F <= 2 omega ||V||_F^2`` and ``sum_i ||d2s_i|| <= 2 omega sqrt(n) ||V||_F^2``
   (``||V^T W^T v_i|| <= omega ||V||_2 ||v_i||``, Cauchy-Schwarz over i).
3. Softmax, with ``abar = a - (f.a) 1``, ``k2 = f.abar^2``, ``k3 = f.abar^3``
   (cumulants of a under f): ``df = f o abar``, ``d2f = f o (abar^2 - k2)``,
   ``d3f = f o (abar^3 - 3 k2 abar - k3)``. For ``||a|| = 1``:
   ``|abar_i| <= sqrt(2) (1 - f_i)`` (Cauchy-Schwarz), ``k2 <= 1/2`` (Popoviciu),
   ``|k3| <= sqrt(2) k2``, and ``||f o h||^2 <= max_i f_i h_i^2``. Hence
   ``c1 = 1/2``, ``c2 = sqrt(max_f f max(2(1-f)^2, 1/2)^2) = 32 / (25 sqrt 5)``,
   ``c3 = sqrt(max_f f (2 sqrt2 (1-f)^3 + 3/sqrt2 (1-f) + 1/sqrt2)^2) <= 7/4``;
   SymPy finds both maxima (:func:`softmax_constants`). Symmetric multilinear
   forms on a Hilbert space attain their norm on the diagonal (Banach), so the
   same constants bound ``d2f[a, b]`` and ``d3f[a, b, c]``.
4. ``V^T (hess L) V = ||dF||^2 + sum_i <r_i, d2f_i[ds_i, ds_i] + J_i d2s_i>``
   with ``||r_i|| <= rho``: the first term is PSD and at most
   ``c1^2 J_S^2``; the second is at most ``negcurv = rho c2 J_S^2 + rho c1 2 omega sqrt(n)``
   in absolute value. So ``L_g = H (c1^2 J_S^2 + negcurv) + gamma_max^2`` and
   ``lambda_min >= l = gamma^2 - H negcurv``.
5. ``d3L[V,V,V] = 3 <dF, d2F> + <R, d3F>``, bounded term by term with
   ``sum_i ||ds_i||^3 <= ||dS||_F^3``; this is ``M`` (the Hessian is
   M-Lipschitz on the convex region because ``|d3L(Z)[V,V,V]| <= M ||V||^3``
   at every Z in it).
6. Output variant: ``o_i = W_V^T X f_i``, ``||r_i|| <= omega_V R + beta = rho``,
   ``||dO||_F <= omega_V sqrt(n) (R c1 J_S + 1) ||V||_F = J_O ||V||_F``
   (``||F||_2 <= sqrt n`` for a row-stochastic F), and the same expansion.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

n, H = sp.symbols("n H", positive=True)
R, omega, mu = sp.symbols("R omega mu", nonnegative=True)
gamma, gamma_max = sp.symbols("gamma gamma_max", nonnegative=True)
omega_V, beta = sp.symbols("omega_V beta", nonnegative=True)
sigma, rho_r = sp.symbols("sigma rho", nonnegative=True)

SYMBOLS = {"n": n, "H": H, "R": R, "omega": omega, "mu": mu, "gamma": gamma, "gamma_max": gamma_max,
           "omega_V": omega_V, "beta": beta, "sigma": sigma, "rho": rho_r}

_f = sp.Symbol("f", positive=True)


def softmax_constants() -> dict[str, sp.Expr]:
    """c1, c2, c3 with the maximisations of step 3 done by SymPy (critical points on [0, 1])."""
    def sup_on_unit_interval(phi):
        crit = [c for c in sp.solve(sp.diff(phi, _f), _f) if c.is_real and 0 <= c <= 1]
        return sp.Max(*[phi.subs(_f, c) for c in crit + [sp.S.Zero, sp.S.One]])

    # c2: h_i = abar_i^2 - k2, |h_i| <= max(abar_i^2, k2) <= max(2 (1-f)^2, 1/2)
    phi2_a = _f * (2 * (1 - _f) ** 2) ** 2
    phi2 = sp.Max(sup_on_unit_interval(phi2_a), sp.Rational(1, 4))  # f * (1/2)^2 <= 1/4
    c2 = sp.sqrt(sp.nsimplify(phi2))
    # c3: |h_i| <= |abar_i|^3 + 3 k2 |abar_i| + |k3| <= 2 sqrt2 (1-f)^3 + 3/sqrt2 (1-f) + 1/sqrt2
    q = sp.sqrt(2) * (1 - _f)
    phi3 = _f * (q**3 + sp.Rational(3, 2) * q + 1 / sp.sqrt(2)) ** 2
    crit = [c for c in sp.Poly(sp.expand(sp.diff(phi3, _f)), _f).nroots() if abs(sp.im(c)) < 1e-12 and 0 <= sp.re(c) <= 1]
    sup3 = max(float(phi3.subs(_f, sp.re(c))) for c in crit + [0, 1])
    c3 = sp.Rational(7, 4)
    if not sup3 <= float(c3**2):
        raise AssertionError(f"c3 = 7/4 does not bound the softmax third derivative: sup = {sup3}")
    return {"c1": sp.Rational(1, 2), "c2": c2, "c3": c3}


_C = softmax_constants()
c1, c2, c3 = _C["c1"], _C["c2"], _C["c3"]

# sigma bounds ||X||_2 (always <= sqrt(n) R) and rho bounds every row residual ||f_i - b_i||
# (always <= sqrt 2); regions default to those worst cases, the solver's local regions use
# the smaller values that hold on its small balls.
J_S = 2 * omega * sigma + sp.sqrt(n) * mu
negcurv_att = rho_r * c2 * J_S**2 + rho_r * c1 * 2 * omega * sp.sqrt(n)
M_att_head = 3 * (c1 * c2 * J_S**3 + 2 * c1**2 * omega * J_S) + rho_r * (c3 * J_S**3 + 6 * c2 * omega * J_S)

rho = omega_V * R + beta
J_O = omega_V * sp.sqrt(n) * (R * c1 * J_S + 1)
K2 = omega_V * (sp.sqrt(n) * R * (c2 * J_S**2 + 2 * c1 * omega * sp.sqrt(n)) + 2 * c1 * sp.sqrt(n) * J_S)
negcurv_out = rho * K2
M_out_head = 3 * J_O * K2 + rho * omega_V * (
    sp.sqrt(n) * R * (c3 * J_S**3 + 6 * c2 * omega * J_S) + 3 * (c2 * J_S**2 + 2 * c1 * omega * sp.sqrt(n))
)


@dataclass(frozen=True)
class Lemma:
    """One bound: what it says, under which assumptions, the constant, the proof, where it is checked.

    - `name`: identifier (also the key in ``bounds(...)`` and in the checker's report)
    - `variant`: ``"attention"``, ``"output"`` or ``"any"``
    - `statement`: the claim in words
    - `quantity`: the exact quantity the checker computes and compares with the constant
    - `constant`: SymPy expression in :data:`SYMBOLS`
    - `kind`: ``"upper"`` (quantity <= constant) or ``"lower"`` (quantity >= constant)
    - `proof`: the steps (numbers refer to the module docstring)
    """

    name: str
    variant: str
    statement: str
    quantity: str
    constant: sp.Expr
    kind: str
    proof: str

    @property
    def symbols(self) -> list[str]:
        return sorted(str(s) for s in self.constant.free_symbols)

    def growth(self) -> str:
        """Leading-order growth in n, R, omega (powers of each variable's highest term)."""
        m = sp.Symbol("m", positive=True)
        e = sp.expand(self.constant.subs(n, m**2))
        parts = []
        for label, var, scale in (("n", m, 2), ("R", R, 1), ("omega", omega, 1)):
            if e.has(var):
                deg = sp.Poly(e, var).degree() if e.is_polynomial(var) else None
                if deg:
                    p = sp.Rational(deg, scale)
                    parts.append(label if p == 1 else f"{label}^{p}")
        return "O(" + " ".join(parts) + ")" if parts else "O(1)"


LEMMAS: tuple[Lemma, ...] = (
    Lemma("logit_bound", "any", "every logit is bounded: max_ij |S_ij| <= omega R^2 + mu R",
          "max_ij |S_ij(X)|", omega * R**2 + mu * R, "upper",
          "|x_i^T W x_j| <= ||W||_2 ||x_i|| ||x_j||, |u^T x_j| <= ||u|| ||x_j||"),
    Lemma("logit_jacobian", "any", "the logits are J_S-Lipschitz in X: ||dS[V]||_F <= J_S ||V||_F, J_S = 2 omega sigma + sqrt(n) mu",
          "||dS[V]||_F / ||V||_F (spectral norm of the Jacobian of S)", J_S, "upper", "step 1"),
    Lemma("logit_curvature", "any", "second derivative of the logits: ||d2S[V,V]||_F <= 2 omega ||V||_F^2",
          "||2 V^T W V||_F / ||V||_F^2", 2 * omega, "upper", "step 2"),
    Lemma("softmax_jacobian", "any", "||diag(f) - f f^T||_2 <= c1 = 1/2 for every f in the simplex",
          "||J(f)||_2", c1, "upper", "a^T J a = Var_f(a) <= (max a - min a)^2 / 4 <= ||a||^2 / 2"),
    Lemma("softmax_second", "any", "||d2 softmax(s)[a, a]|| <= c2 ||a||^2 for every s",
          "||d2f[a, a]|| / ||a||^2", c2, "upper", "step 3"),
    Lemma("softmax_third", "any", "||d3 softmax(s)[a, a, a]|| <= c3 ||a||^3 for every s",
          "||d3f[a, a, a]|| / ||a||^3", c3, "upper", "step 3"),
    Lemma("gradient_bound", "attention", "||grad L_att||_F <= H J_S sqrt(n) rho / 2 on the region",
          "||grad L_att(X)||_F", H * J_S * sp.sqrt(n) * rho_r / 2, "upper",
          "grad = dS^*(G), rows g_i = J_i r_i, ||J_i r_i|| <= c1 rho; step 1"),
    Lemma("gradient_lipschitz", "attention", "||hess L||_2 <= L_g on the region (L = L_att + L_reg)",
          "max |eigvalsh(hess L(X))|", H * (c1**2 * J_S**2 + negcurv_att) + gamma_max**2, "upper", "step 4"),
    Lemma("hessian_lipschitz", "attention", "the Hessian of L is M-Lipschitz: ||hess L(X) - hess L(Y)||_2 <= M ||X - Y||_F",
          "|d3L(X)[V,V,V]| / ||V||^3, and ||hess L(X) - hess L(Y)||_2 / ||X - Y||_F", H * M_att_head, "upper", "step 5"),
    Lemma("strong_convexity", "attention", "lambda_min(hess L) >= l = gamma^2 - H negcurv on the region",
          "lambda_min(hess L(X))", gamma**2 - H * negcurv_att, "lower", "step 4"),
    Lemma("gradient_bound_output", "output", "||grad L_out||_F <= H J_O sqrt(n) rho on the region",
          "||grad L_out(X)||_F", H * J_O * sp.sqrt(n) * rho, "upper", "grad = dO^*(R), ||R||_F <= sqrt(n) rho; step 6"),
    Lemma("gradient_lipschitz_output", "output", "||hess L||_2 <= L_g on the region (L = L_out + L_reg)",
          "max |eigvalsh(hess L(X))|", H * (J_O**2 + negcurv_out) + gamma_max**2, "upper", "steps 4, 6"),
    Lemma("hessian_lipschitz_output", "output", "the Hessian of L_out is M-Lipschitz on the region",
          "|d3L(X)[V,V,V]| / ||V||^3", H * M_out_head, "upper", "steps 5, 6"),
    Lemma("output_map_curvature", "output",
          "the outputs' second derivative, all heads stacked: ||d2O[V,V]||_F <= sqrt(H) K2 ||V||_F^2, so the "
          "Jacobian of X -> O(X) is sqrt(H) K2-Lipschitz on the region (the K of the Kantorovich root test)",
          "||d2O[V,V]||_F / ||V||_F^2 over all heads", sp.sqrt(H) * K2, "upper",
          "step 6: d2O = d2F X^T W_V + 2 dF V^T W_V, the K2 of negcurv_out per head; the norm of a "
          "symmetric bilinear map is attained on the diagonal (polarisation with a unit vector w)"),
    Lemma("strong_convexity_output", "output", "lambda_min(hess L) >= l = gamma^2 - H negcurv_out on the region",
          "lambda_min(hess L(X))", gamma**2 - H * negcurv_out, "lower", "steps 4, 6"),
)


def lemma(name: str) -> Lemma:
    for lem in LEMMAS:
        if lem.name == name:
            return lem
    raise KeyError(f"no lemma named {name!r}; known: {', '.join(l.name for l in LEMMAS)}")


def self_concordance(M, l):
    """``M_f = M / (2 l^{3/2})``: f is self-concordant with this constant where l > 0."""
    return M / (2 * l ** sp.Rational(3, 2))


def bounds_source() -> str:
    """Generated JAX evaluators of every constant (appended to solver/_generated.py)."""
    from .codegen import scalar_function

    args = [n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho_r]
    out = ["\n\n# Lemma constants (derivations/lemmas.py), as functions of the region's parameters.\n\n"]
    names = []
    for lem in LEMMAS:
        fname = f"bound_{lem.name}"
        out.append("\n" + scalar_function(fname, lem.constant, args, f"{lem.statement}.") + "\n")
        names.append((lem.name, fname, lem.variant))
    out.append("\ndef bounds(n, H, R, omega, mu, gamma, gamma_max, omega_V=0.0, beta=0.0, sigma=None, rho=None, "
               "variant=\"attention\"):\n")
    out.append('    """Every lemma constant of ``variant`` (and the variant-free ones) on one region, as a dict."""\n')
    out.append("    sigma = jnp.sqrt(n) * R if sigma is None else sigma\n")
    out.append("    rho = jnp.sqrt(2.0) if rho is None else rho\n")
    out.append("    args = (n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho)\n")
    out.append("    out = {}\n")
    for name, fname, variant in names:
        if variant == "any":
            out.append(f"    out[{name!r}] = {fname}(*args)\n")
        else:
            out.append(f"    if variant == {variant!r}:\n        out[{name!r}] = {fname}(*args)\n")
    out.append("    return out\n")
    return "".join(out)


def describe_lemmas() -> str:
    lines = ["Lemma constants (region: column norms <= R, ||W_h|| <= omega, ||u_h|| <= mu, H heads, n tokens,",
             f"gamma = min Gamma; softmax constants c1 = {c1}, c2 = {c2} ~ {float(c2):.4f}, c3 = {c3}):", ""]
    for lem in LEMMAS:
        lines.append(f"[{lem.name}] ({lem.variant}) {lem.statement}")
        lines.append(f"    constant = {sp.sstr(sp.simplify(lem.constant))}")
        lines.append(f"    growth   = {lem.growth()}; checked on: {lem.quantity}")
    lines.append("")
    lines.append("self-concordance: M_f = M / (2 l^(3/2)) wherever l > 0.")
    return "\n".join(lines)
