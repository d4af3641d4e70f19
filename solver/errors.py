"""Typed errors. Each message says what was wrong and what to do about it."""

from __future__ import annotations


class UnmaskError(Exception):
    """Base class of every error this project raises on purpose."""


class InvalidProblemError(UnmaskError, ValueError):
    """An instance (W, B, u, W_V, Gamma, X0, X) breaks a rule of the formulation."""


class InvalidRegionError(UnmaskError, ValueError):
    """A region or an assumption of a lemma is inconsistent, or an instance lies outside it."""


class CertificationError(UnmaskError):
    """A bound could not be certified on the region at hand; nothing was certified."""


class CertificateMismatchError(UnmaskError):
    """A certificate does not match the instance it was presented with, or fails recomputation."""


class LinearSolveError(UnmaskError, ArithmeticError):
    """A Newton linear solve was singular or produced non-finite values."""


class MemoryBudgetError(UnmaskError, MemoryError):
    """The estimated memory of an operation exceeds the budget; nothing was allocated."""


class ModelUnavailableError(UnmaskError, ImportError):
    """A real model's package is not installed; the message gives the install command."""


class InputFileError(UnmaskError, OSError):
    """An input file is missing, unreadable or holds the wrong kind of data."""
