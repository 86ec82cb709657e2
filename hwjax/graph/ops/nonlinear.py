"""Op kinds for nonlinear operators (softmax).

=================  =======  ==========================================================
op                 inputs   attributes
=================  =======  ==========================================================
``softmax``        1        ``beta`` (positive float), ``axis`` (-1, the last axis):
                            ``y = q_out(softmax(beta * real(x)))`` along ``axis``,
                            ``softmax(v)_i = exp(v_i - max v) / sum_j exp(v_j - max v)``
=================  =======  ==========================================================
"""

from __future__ import annotations

import math
import numbers

from hwjax.errors import RangeError, ShapeError
from hwjax.graph._ops import OpSpec, register_op


class Softmax(OpSpec):
    """``y = q_out(softmax(beta * real(x)))`` along the last axis of each example. The
    input's zero point cancels (only differences to the row maximum matter); each target
    defines its integer algorithm (TFLite: per runtime)."""

    name = "softmax"
    attrs = {"beta": 1.0, "axis": -1}
    choices = {"axis": (-1,)}

    def check(self, node, ins):
        super().check(node, ins)
        beta = self.attr(node, "beta")
        if isinstance(beta, bool) or not (isinstance(beta, numbers.Real) and math.isfinite(beta) and beta > 0):
            raise ShapeError(f"beta must be a positive finite number, got {beta!r}")
        if ins and len(ins[0].shape) < 1:
            raise RangeError("softmax needs at least one axis per example")


register_op(Softmax())
