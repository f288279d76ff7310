"""`dense(x, w)`: x @ w with a backward pass laid out for XLA's CPU backend.

Why not plain `x @ w`: for the weight gradient dW = x^T dy (contracting the B*S rows), XLA:CPU's
layout assignment transposes the *larger* of the two operands into a [features, rows] copy, and
fuses that copy with the preceding elementwise backward ops (SwiGLU's silu'), so the fusion walks
memory with a stride of the feature width. Profiled on the tiny benchmark shape (BERT, d 256,
FFN 1024, 4096 rows, 2 cores) those four transposing fusions took 280 of 1160 ms per step (24%).
Here the backward transposes the *smaller* operand explicitly and pins it with
`optimization_barrier`, so the simplifier cannot fold the transpose back into the dot, and the
dot sees the canonical [M, K] x [K, N] layouts. Accelerators transpose inside their matmul units,
so everywhere but CPU `dense` is plain `x @ w`.
"""

import jax
import jax.numpy as jnp


@jax.custom_vjp
def _dense_cpu(x: jax.Array, w: jax.Array) -> jax.Array:
  return x @ w


def _fwd(x, w):
  return x @ w, (x, w)


def _bwd(res, g):
  x, w = res
  d_in, d_out = w.shape
  dx = g @ w.T  # [..., d_in]
  x2, g2 = x.reshape(-1, d_in), g.reshape(-1, d_out)  # [R, d_in], [R, d_out]
  if d_in <= d_out:
    dw = jax.lax.optimization_barrier(x2.T) @ g2  # [d_in, R] @ [R, d_out]
  else:
    dw = (jax.lax.optimization_barrier(g2.T) @ x2).T  # ([d_out, R] @ [R, d_in])^T
  return dx, dw.astype(w.dtype)


_dense_cpu.defvjp(_fwd, _bwd)


def dense(x: jax.Array, w: jax.Array, preferred_element_type=None) -> jax.Array:
  """x [..., d_in] @ w [d_in, d_out] -> [..., d_out] (same result and gradients as `x @ w`).

  `preferred_element_type` (e.g. float32 logits from bfloat16 operands) as in `jnp.matmul`.
  """
  if jax.default_backend() == "cpu":
    out = _dense_cpu(x, w)
    return out if preferred_element_type is None else out.astype(preferred_element_type)
  return jnp.matmul(x, w, preferred_element_type=preferred_element_type)
