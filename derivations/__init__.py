"""Symbolic side of unmask: the losses, their derivatives, the bound lemmas, and
the generator of the JAX code the solver runs. Nothing here imports ``solver``.
"""

from .calculus import FrobeniusSq, RowSoftmax, gradient, tangent
from .losses import Derivation, all_derivations, attention_head, output_head, regulariser

__all__ = [
    "Derivation",
    "FrobeniusSq",
    "RowSoftmax",
    "all_derivations",
    "attention_head",
    "gradient",
    "output_head",
    "regulariser",
    "tangent",
]
