"""jax_dash's version, and the version of the bits its kernels compute.

jax_dash promises bits: the same inputs, shapes, schedule and kernel choice give the same output
and gradients, run after run (docs/determinism.md). A release that changes any kernel's arithmetic
breaks that promise across the upgrade, so the version number says when it happens:

- ``__version__`` is MAJOR.MINOR.PATCH. The MINOR number goes up whenever the bits of any kernel
  change (forward or backward, Hopper or CPU), and with it ``BITS_VERSION``. A PATCH release never
  changes bits: what 0.2.x computed, any other 0.2.x computes to the bit (same inputs, GPU model
  or CPU, schedule and kernel choice). While MAJOR is 0, a MINOR step may also change the API.
- ``BITS_VERSION`` numbers the forward's and the backward's bits separately, as
  docs/determinism.md does; a field goes up when what its pass computes for some call changes:
  its kernels' arithmetic, or the schedule or kernel a default picks (``schedule="auto"``). It is
  not a hash of the bits: within one bits version, the bits still depend on the schedule and the
  kernel choice (and, for ``shift``/``symmetric_shift``, the wave width), as docs/determinism.md
  lists. CHANGELOG.md marks every change of bits.

This file is the single source of the version: pyproject.toml's metadata reads ``__version__``
from it (scikit-build-core's regex provider), so ``importlib.metadata.version("jax_dash")`` of an
installed jax_dash equals ``jax_dash.__version__``.
"""

from typing import NamedTuple

__all__ = ["__version__", "BITS_VERSION", "BitsVersion"]

__version__ = "0.2.0"


class BitsVersion(NamedTuple):
    """The bits versions of the forward and backward kernels (docs/determinism.md)."""

    forward: int
    backward: int


# forward 2: "Forward bits version 2" of docs/determinism.md (2026-11-25): with a positive scale and
#   no soft cap the Hopper forwards compute P as ex2(fma(S, scale*log2e, -m)), one rounding fewer
#   than version 1 (a zero or negative scale, or a soft cap, keeps the version-1 arithmetic).
#   jax_dash 0.1.0 carried both forward versions under one version number.
# backward 1: docs/determinism.md numbers no backward version; 1 names the backward bits of 0.2.0
#   (on the GPU two families until 2026-11-26: the warp-specialized kernels' and the classic
#   kernel's, which ran queries too long for the former's tables; the classic kernel is deleted
#   and those queries are refused, so one family is left, the warp-specialized kernels'). The backward bits changes within 0.1.0 (CHANGELOG.md:
#   per-head waves 2026-11-22, the warp-specialized default 2026-11-23, auto's schedules
#   2026-11-23/24) predate the numbering.
BITS_VERSION = BitsVersion(forward=2, backward=1)
