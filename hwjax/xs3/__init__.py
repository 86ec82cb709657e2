"""XMOS xcore.ai XS3 VPU and lib_nn kernels, bit-exact (spec: shared/spec/xs3.md).

Every function takes ``variant="hardware"`` (default), ``"host"`` or ``"v2021"``.
"""

from hwjax.xs3._vpu import (
    MODES,
    VARIANTS,
    acc40_from_registers,
    as_acc40,
    vdepth1,
    vdepth8,
    vdepth16,
    vladd,
    vlashr,
    vlmacc,
    vlmaccr,
    vlmaccr1,
    vlmul,
    vlsat,
    vlsub,
    vpos,
)
from hwjax.xs3._otfn import (
    deserialise_output_transform,
    canonical_transform,
    narrow_accu_range,
    otfn_binary,
    otfn_int8,
    otfn_int8_channelwise,
    otfn_int8_clamped,
    otfn_int8_steps,
    otfn_params_from_scales,
    serialise_output_transform,
    solve_exponents,
)
from hwjax.xs3._params import otfn_params, otfn_params_many
from hwjax.xs3._conv import (
    add_elementwise_int8,
    add_int8,
    add_per_example,
    conv2d,
    depthwise_conv2d,
    im2col,
    reorder_kernel_weights,
    reorder_kernel_weights_inverse,
)
from hwjax.xs3._bso import BsoFields, derive_bso_fields, make_bso, split_bso
from hwjax.xs3._legacy import (
    LegacyStats,
    add_elementwise,
    bso_output,
    argmax_16,
    avgpool2d,
    avgpool2d_global,
    avgpool2d_scale_shift,
    certify_no_saturation,
    conv2d_1x1,
    conv2d_deep,
    conv2d_depthwise,
    conv2d_shallowin,
    fc_deepin_shallowout_8,
    fc_deepin_shallowout_16,
    fully_connected_8,
    fully_connected_16,
    lookup8,
    maxpool2d,
    requantize_16_to_8,
)
