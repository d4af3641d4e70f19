# GENERATED FILE: DO NOT EDIT.
# Produced by `unmask derive` (python -m derivations) from the SymPy derivations in
# derivations/; `unmask derive --check` fails when this file is stale.
"""JAX kernels generated from the symbolic derivation of the unmask losses.

Shapes: X, V, Gamma, X0 are (d, n); per head W is (d, d), u is (d,), B is (n, n)
(attention-matrix loss) or (n, d_v) (attention-output loss), Wv is (d, d_v).
The assembled functions take stacked heads: W (H, d, d), U (H, d), B (H, ...).
All functions are pure, jit-able and vmap-able, and compute in the dtype of
their inputs (pass arrays of one dtype).
"""

import jax
import jax.numpy as jnp


def attention_head_loss(X, W, u, B):
    """Loss: 1/2 ||softmax(X^T W X + 1 u^T X) - B||_F^2 (one head of the attention-matrix loss)."""
    d, n = X.shape
    u = jnp.reshape(u, (d, 1))
    t0 = u.T
    t1 = t0 @ X
    t2 = jnp.broadcast_to(t1, (n, n))
    t3 = X.T
    t4 = W @ X
    t5 = t3 @ t4
    t6 = t2 + t5
    t7 = jax.nn.softmax(t6, axis=-1)
    t8 = t7 - B
    t9 = jnp.sum(t8 * t8)
    t10 = (0.5) * t9
    return t10

def attention_head_grad(X, W, u, B):
    """Gradient of attention_head_loss with respect to X (d x n)."""
    d, n = X.shape
    u = jnp.reshape(u, (d, 1))
    t0 = u.T
    t1 = t0 @ X
    t2 = jnp.broadcast_to(t1, (n, n))
    t3 = X.T
    t4 = W @ X
    t5 = t3 @ t4
    t6 = t2 + t5
    t7 = jax.nn.softmax(t6, axis=-1)
    t8 = t7 - B
    t9 = t8 * t7
    t10 = jnp.sum(t9, axis=1, keepdims=True)
    t11 = jnp.broadcast_to(t10, (n, n))
    t12 = t11 * t7
    t13 = t9 - t12
    t14 = t13.T
    t15 = X @ t14
    t16 = W @ t15
    t17 = jnp.sum(t13, axis=0, keepdims=True)
    t18 = u @ t17
    t19 = W.T
    t20 = X @ t13
    t21 = t19 @ t20
    t22 = t16 + t18 + t21
    return t22

def attention_head_hvp(X, V, W, u, B):
    """Hessian of attention_head_loss applied to V (d x n)."""
    d, n = X.shape
    u = jnp.reshape(u, (d, 1))
    t0 = u.T
    t1 = t0 @ X
    t2 = jnp.broadcast_to(t1, (n, n))
    t3 = X.T
    t4 = W @ X
    t5 = t3 @ t4
    t6 = t2 + t5
    t7 = jax.nn.softmax(t6, axis=-1)
    t8 = t7 - B
    t9 = t8 * t7
    t10 = jnp.sum(t9, axis=1, keepdims=True)
    t11 = jnp.broadcast_to(t10, (n, n))
    t12 = t0 @ V
    t13 = jnp.broadcast_to(t12, (n, n))
    t14 = V.T
    t15 = t14 @ t4
    t16 = W @ V
    t17 = t3 @ t16
    t18 = t13 + t15 + t17
    t19 = t18 * t7
    t20 = jnp.sum(t19, axis=1, keepdims=True)
    t21 = jnp.broadcast_to(t20, (n, n))
    t22 = t21 * t7
    t23 = t15 + t17
    t24 = t13 + t23
    t25 = t24 * t7
    t26 = t25 - t22
    t27 = t11 * t26
    t28 = t26 * t7
    t29 = t26 * t8
    t30 = t28 + t29
    t31 = jnp.sum(t30, axis=1, keepdims=True)
    t32 = jnp.broadcast_to(t31, (n, n))
    t33 = t32 * t7
    t34 = t27 + t33
    t35 = t29 + t28
    t36 = t35 - t34
    t37 = jnp.sum(t36, axis=0, keepdims=True)
    t38 = u @ t37
    t39 = t11 * t7
    t40 = t9 - t39
    t41 = W.T
    t42 = t14 @ t41
    t43 = t40 @ t42
    t44 = t19 - t22
    t45 = t44 * t8
    t46 = t44 * t7
    t47 = t45 + t46
    t48 = jnp.sum(t47, axis=1, keepdims=True)
    t49 = jnp.broadcast_to(t48, (n, n))
    t50 = t49 * t7
    t51 = t11 * t44
    t52 = t45 + t46 - t50 - t51
    t53 = t3 @ t41
    t54 = t52 @ t53
    t55 = t43 + t54
    t56 = t55.T
    t57 = V @ t40
    t58 = t41 @ t57
    t59 = X @ t36
    t60 = t41 @ t59
    t61 = t58 + t60
    t62 = t38 + t56 + t61
    return t62


def output_head_loss(X, W, u, Wv, B):
    """Loss: 1/2 ||softmax(X^T W X + 1 u^T X) X^T W_V - B||_F^2 (one head of the attention-output loss)."""
    d, n = X.shape
    u = jnp.reshape(u, (d, 1))
    t0 = u.T
    t1 = t0 @ X
    t2 = jnp.broadcast_to(t1, (n, n))
    t3 = X.T
    t4 = W @ X
    t5 = t3 @ t4
    t6 = t2 + t5
    t7 = jax.nn.softmax(t6, axis=-1)
    t8 = t3 @ Wv
    t9 = t7 @ t8
    t10 = t9 - B
    t11 = jnp.sum(t10 * t10)
    t12 = (0.5) * t11
    return t12

def output_head_grad(X, W, u, Wv, B):
    """Gradient of output_head_loss with respect to X (d x n)."""
    d, n = X.shape
    u = jnp.reshape(u, (d, 1))
    t0 = u.T
    t1 = t0 @ X
    t2 = jnp.broadcast_to(t1, (n, n))
    t3 = X.T
    t4 = W @ X
    t5 = t3 @ t4
    t6 = t2 + t5
    t7 = jax.nn.softmax(t6, axis=-1)
    t8 = t3 @ Wv
    t9 = t7 @ t8
    t10 = t9 - B
    t11 = Wv.T
    t12 = t11 @ X
    t13 = t10 @ t12
    t14 = t13 * t7
    t15 = jnp.sum(t14, axis=1, keepdims=True)
    t16 = jnp.broadcast_to(t15, (n, n))
    t17 = t16 * t7
    t18 = t14 - t17
    t19 = t18.T
    t20 = X @ t19
    t21 = W @ t20
    t22 = t10.T
    t23 = t22 @ t7
    t24 = Wv @ t23
    t25 = jnp.sum(t18, axis=0, keepdims=True)
    t26 = u @ t25
    t27 = W.T
    t28 = X @ t18
    t29 = t27 @ t28
    t30 = t21 + t24 + t26 + t29
    return t30

def output_head_hvp(X, V, W, u, Wv, B):
    """Hessian of output_head_loss applied to V (d x n)."""
    d, n = X.shape
    u = jnp.reshape(u, (d, 1))
    t0 = u.T
    t1 = t0 @ X
    t2 = jnp.broadcast_to(t1, (n, n))
    t3 = X.T
    t4 = W @ X
    t5 = t3 @ t4
    t6 = t2 + t5
    t7 = jax.nn.softmax(t6, axis=-1)
    t8 = t3 @ Wv
    t9 = t7 @ t8
    t10 = t9 - B
    t11 = Wv.T
    t12 = t11 @ X
    t13 = t10 @ t12
    t14 = t13 * t7
    t15 = jnp.sum(t14, axis=1, keepdims=True)
    t16 = jnp.broadcast_to(t15, (n, n))
    t17 = t0 @ V
    t18 = jnp.broadcast_to(t17, (n, n))
    t19 = V.T
    t20 = t19 @ t4
    t21 = W @ V
    t22 = t3 @ t21
    t23 = t18 + t20 + t22
    t24 = t23 * t7
    t25 = jnp.sum(t24, axis=1, keepdims=True)
    t26 = jnp.broadcast_to(t25, (n, n))
    t27 = t26 * t7
    t28 = t20 + t22
    t29 = t18 + t28
    t30 = t29 * t7
    t31 = t30 - t27
    t32 = t16 * t31
    t33 = t13 * t31
    t34 = t11 @ V
    t35 = t10 @ t34
    t36 = t31 @ t8
    t37 = t19 @ Wv
    t38 = t7 @ t37
    t39 = t36 + t38
    t40 = t39 @ t12
    t41 = t35 + t40
    t42 = t41 * t7
    t43 = t33 + t42
    t44 = jnp.sum(t43, axis=1, keepdims=True)
    t45 = jnp.broadcast_to(t44, (n, n))
    t46 = t45 * t7
    t47 = t32 + t46
    t48 = t43 - t47
    t49 = jnp.sum(t48, axis=0, keepdims=True)
    t50 = u @ t49
    t51 = t16 * t7
    t52 = t14 - t51
    t53 = W.T
    t54 = t19 @ t53
    t55 = t52 @ t54
    t56 = t24 - t27
    t57 = t13 * t56
    t58 = t56 @ t8
    t59 = t58 + t38
    t60 = t59 @ t12
    t61 = t35 + t60
    t62 = t61 * t7
    t63 = t57 + t62
    t64 = jnp.sum(t63, axis=1, keepdims=True)
    t65 = jnp.broadcast_to(t64, (n, n))
    t66 = t65 * t7
    t67 = t16 * t56
    t68 = t57 + t62 - t66 - t67
    t69 = t3 @ t53
    t70 = t68 @ t69
    t71 = t55 + t70
    t72 = t71.T
    t73 = t10.T
    t74 = t73 @ t31
    t75 = Wv @ t74
    t76 = t59.T
    t77 = t76 @ t7
    t78 = Wv @ t77
    t79 = t75 + t78
    t80 = V @ t52
    t81 = t53 @ t80
    t82 = X @ t48
    t83 = t53 @ t82
    t84 = t81 + t83
    t85 = t50 + t72 + t79 + t84
    return t85


def regulariser_loss(X, Gamma, X0):
    """Loss: 1/2 ||Gamma o (X - X0)||_F^2 (entrywise weights Gamma >= 0, prior X0)."""
    d, n = X.shape
    t0 = X - X0
    t1 = t0 * Gamma
    t2 = jnp.sum(t1 * t1)
    t3 = (0.5) * t2
    return t3

def regulariser_grad(X, Gamma, X0):
    """Gradient of regulariser_loss with respect to X (d x n)."""
    d, n = X.shape
    t0 = X - X0
    t1 = t0 * Gamma
    t2 = t1 * Gamma
    return t2

def regulariser_hvp(X, V, Gamma, X0):
    """Hessian of regulariser_loss applied to V (d x n)."""
    d, n = X.shape
    t0 = Gamma * V
    t1 = t0 * Gamma
    return t1


# Assembly: sum over heads (leading axis of W, U, B[, Wv]) plus the regulariser,
# and the dense Hessian as the matrix of the HVP operator (row-major vec).


def _sum_heads(fn, X, heads, in_axes):
    return jnp.sum(jax.vmap(fn, in_axes=in_axes)(X, *heads), axis=0)


def attention_loss(X, W, U, B, Gamma, X0):
    """sum_h attention_head_loss(X, W[h], U[h], B[h]) + regulariser_loss(X, Gamma, X0)."""
    return _sum_heads(attention_head_loss, X, (W, U, B), (None, 0, 0, 0)) + regulariser_loss(X, Gamma, X0)


def attention_grad(X, W, U, B, Gamma, X0):
    """Gradient of attention_loss with respect to X (d x n)."""
    return _sum_heads(attention_head_grad, X, (W, U, B), (None, 0, 0, 0)) + regulariser_grad(X, Gamma, X0)


def attention_hvp(X, V, W, U, B, Gamma, X0):
    """Hessian of attention_loss applied to V (d x n)."""
    head = jax.vmap(attention_head_hvp, in_axes=(None, None, 0, 0, 0))(X, V, W, U, B)
    return jnp.sum(head, axis=0) + regulariser_hvp(X, V, Gamma, X0)


def attention_hessian(X, W, U, B, Gamma, X0):
    """Dense (dn) x (dn) Hessian of attention_loss; column k is the HVP of basis matrix k."""
    d, n = X.shape
    basis = jnp.eye(d * n, dtype=X.dtype).reshape(d * n, d, n)
    cols = jax.vmap(lambda E: attention_hvp(X, E, W, U, B, Gamma, X0))(basis)
    return cols.reshape(d * n, d * n).T


def output_loss(X, W, U, Wv, B, Gamma, X0):
    """sum_h output_head_loss(X, W[h], U[h], Wv[h], B[h]) + regulariser_loss(X, Gamma, X0)."""
    return _sum_heads(output_head_loss, X, (W, U, Wv, B), (None, 0, 0, 0, 0)) + regulariser_loss(X, Gamma, X0)


def output_grad(X, W, U, Wv, B, Gamma, X0):
    """Gradient of output_loss with respect to X (d x n)."""
    return _sum_heads(output_head_grad, X, (W, U, Wv, B), (None, 0, 0, 0, 0)) + regulariser_grad(X, Gamma, X0)


def output_hvp(X, V, W, U, Wv, B, Gamma, X0):
    """Hessian of output_loss applied to V (d x n)."""
    head = jax.vmap(output_head_hvp, in_axes=(None, None, 0, 0, 0, 0))(X, V, W, U, Wv, B)
    return jnp.sum(head, axis=0) + regulariser_hvp(X, V, Gamma, X0)


def output_hessian(X, W, U, Wv, B, Gamma, X0):
    """Dense (dn) x (dn) Hessian of output_loss; column k is the HVP of basis matrix k."""
    d, n = X.shape
    basis = jnp.eye(d * n, dtype=X.dtype).reshape(d * n, d, n)
    cols = jax.vmap(lambda E: output_hvp(X, E, W, U, Wv, B, Gamma, X0))(basis)
    return cols.reshape(d * n, d * n).T


# Lemma constants (derivations/lemmas.py), as functions of the region's parameters.


def bound_logit_bound(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """every logit is bounded: max_ij |S_ij| <= omega R^2 + mu R."""
    return R**2*omega + R*mu


def bound_logit_jacobian(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """the logits are J_S-Lipschitz in X: ||dS[V]||_F <= J_S ||V||_F, J_S = 2 omega sigma + sqrt(n) mu."""
    return mu*jnp.sqrt(n) + 2*omega*sigma


def bound_logit_curvature(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """second derivative of the logits: ||d2S[V,V]||_F <= 2 omega ||V||_F^2."""
    return 2*omega


def bound_softmax_jacobian(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """||diag(f) - f f^T||_2 <= c1 = 1/2 for every f in the simplex."""
    return 1/2


def bound_softmax_second(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """||d2 softmax(s)[a, a]|| <= c2 ||a||^2 for every s."""
    return (32/125)*jnp.sqrt(5)


def bound_softmax_third(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """||d3 softmax(s)[a, a, a]|| <= c3 ||a||^3 for every s."""
    return 7/4


def bound_gradient_bound(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """||grad L_att||_F <= H J_S sqrt(n) rho / 2 on the region."""
    return (1/2)*H*jnp.sqrt(n)*rho*(mu*jnp.sqrt(n) + 2*omega*sigma)


def bound_gradient_lipschitz(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """||hess L||_2 <= L_g on the region (L = L_att + L_reg)."""
    return H*(jnp.sqrt(n)*omega*rho + (32/125)*jnp.sqrt(5)*rho*(mu*jnp.sqrt(n) + 2*omega*sigma)**2 + (1/4)*(mu*jnp.sqrt(n) + 2*omega*sigma)**2) + gamma_max**2


def bound_hessian_lipschitz(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """the Hessian of L is M-Lipschitz: ||hess L(X) - hess L(Y)||_2 <= M ||X - Y||_F."""
    return H*((3/2)*omega*(mu*jnp.sqrt(n) + 2*omega*sigma) + rho*((192/125)*jnp.sqrt(5)*omega*(mu*jnp.sqrt(n) + 2*omega*sigma) + (7/4)*(mu*jnp.sqrt(n) + 2*omega*sigma)**3) + (48/125)*jnp.sqrt(5)*(mu*jnp.sqrt(n) + 2*omega*sigma)**3)


def bound_strong_convexity(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """lambda_min(hess L) >= l = gamma^2 - H negcurv on the region."""
    return -H*(jnp.sqrt(n)*omega*rho + (32/125)*jnp.sqrt(5)*rho*(mu*jnp.sqrt(n) + 2*omega*sigma)**2) + gamma**2


def bound_gradient_bound_output(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """||grad L_out||_F <= H J_O sqrt(n) rho on the region."""
    return H*n*omega_V*(R*omega_V + beta)*((1/2)*R*(mu*jnp.sqrt(n) + 2*omega*sigma) + 1)


def bound_gradient_lipschitz_output(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """||hess L||_2 <= L_g on the region (L = L_out + L_reg)."""
    return H*(n*omega_V**2*((1/2)*R*(mu*jnp.sqrt(n) + 2*omega*sigma) + 1)**2 + omega_V*(R*omega_V + beta)*(R*jnp.sqrt(n)*(jnp.sqrt(n)*omega + (32/125)*jnp.sqrt(5)*(mu*jnp.sqrt(n) + 2*omega*sigma)**2) + jnp.sqrt(n)*(mu*jnp.sqrt(n) + 2*omega*sigma))) + gamma_max**2


def bound_hessian_lipschitz_output(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """the Hessian of L_out is M-Lipschitz on the region."""
    return H*(3*jnp.sqrt(n)*omega_V**2*((1/2)*R*(mu*jnp.sqrt(n) + 2*omega*sigma) + 1)*(R*jnp.sqrt(n)*(jnp.sqrt(n)*omega + (32/125)*jnp.sqrt(5)*(mu*jnp.sqrt(n) + 2*omega*sigma)**2) + jnp.sqrt(n)*(mu*jnp.sqrt(n) + 2*omega*sigma)) + omega_V*(R*omega_V + beta)*(R*jnp.sqrt(n)*((192/125)*jnp.sqrt(5)*omega*(mu*jnp.sqrt(n) + 2*omega*sigma) + (7/4)*(mu*jnp.sqrt(n) + 2*omega*sigma)**3) + 3*jnp.sqrt(n)*omega + (96/125)*jnp.sqrt(5)*(mu*jnp.sqrt(n) + 2*omega*sigma)**2))


def bound_output_map_curvature(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """the outputs' second derivative, all heads stacked: ||d2O[V,V]||_F <= sqrt(H) K2 ||V||_F^2, so the Jacobian of X -> O(X) is sqrt(H) K2-Lipschitz on the region (the K of the Kantorovich root test)."""
    return jnp.sqrt(H)*omega_V*(R*jnp.sqrt(n)*(jnp.sqrt(n)*omega + (32/125)*jnp.sqrt(5)*(mu*jnp.sqrt(n) + 2*omega*sigma)**2) + jnp.sqrt(n)*(mu*jnp.sqrt(n) + 2*omega*sigma))


def bound_strong_convexity_output(n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho):
    """lambda_min(hess L) >= l = gamma^2 - H negcurv_out on the region."""
    return -H*omega_V*(R*omega_V + beta)*(R*jnp.sqrt(n)*(jnp.sqrt(n)*omega + (32/125)*jnp.sqrt(5)*(mu*jnp.sqrt(n) + 2*omega*sigma)**2) + jnp.sqrt(n)*(mu*jnp.sqrt(n) + 2*omega*sigma)) + gamma**2


def bounds(n, H, R, omega, mu, gamma, gamma_max, omega_V=0.0, beta=0.0, sigma=None, rho=None, variant="attention"):
    """Every lemma constant of ``variant`` (and the variant-free ones) on one region, as a dict."""
    sigma = jnp.sqrt(n) * R if sigma is None else sigma
    rho = jnp.sqrt(2.0) if rho is None else rho
    args = (n, H, R, omega, mu, gamma, gamma_max, omega_V, beta, sigma, rho)
    out = {}
    out['logit_bound'] = bound_logit_bound(*args)
    out['logit_jacobian'] = bound_logit_jacobian(*args)
    out['logit_curvature'] = bound_logit_curvature(*args)
    out['softmax_jacobian'] = bound_softmax_jacobian(*args)
    out['softmax_second'] = bound_softmax_second(*args)
    out['softmax_third'] = bound_softmax_third(*args)
    if variant == 'attention':
        out['gradient_bound'] = bound_gradient_bound(*args)
    if variant == 'attention':
        out['gradient_lipschitz'] = bound_gradient_lipschitz(*args)
    if variant == 'attention':
        out['hessian_lipschitz'] = bound_hessian_lipschitz(*args)
    if variant == 'attention':
        out['strong_convexity'] = bound_strong_convexity(*args)
    if variant == 'output':
        out['gradient_bound_output'] = bound_gradient_bound_output(*args)
    if variant == 'output':
        out['gradient_lipschitz_output'] = bound_gradient_lipschitz_output(*args)
    if variant == 'output':
        out['hessian_lipschitz_output'] = bound_hessian_lipschitz_output(*args)
    if variant == 'output':
        out['output_map_curvature'] = bound_output_map_curvature(*args)
    if variant == 'output':
        out['strong_convexity_output'] = bound_strong_convexity_output(*args)
    return out
