"""unmask: can the data fed into a transformer be recovered from its attention?

The user-facing layer: the ``unmask`` command line (:mod:`unmask.cli`) and the
real pretrained models (:mod:`unmask.models`). The mathematics lives in the
top-level packages ``derivations`` (symbolic), ``solver`` (numerical) and
``proofs_check`` (numerical checks of every symbolic claim).
"""

__version__ = "0.1.0"
