"""NVIDIA NVDLA: LUT unit, convertors, in-memory formats and INT8 layer kernels, bit-exact (spec: shared/spec/nvdla.md)."""

from hwjax.nvdla._lut import (
    COUNTERS,
    HIT,
    LE,
    LE_DEPTH,
    LO,
    LO_DEPTH,
    OFLOW,
    UFLOW,
    CdpLutConfig,
    SdpLutConfig,
    cdp_lrn,
    cdp_lut,
    cdp_sqsum,
    sdp_lut,
)

# Convertors and in-memory formats (spec sections 5 and 6).
from hwjax.nvdla._cvt import (
    CONVERTORS,
    INF_REPLACEMENT,
    ConvertorSpec,
    check_precision_conversion,
    cvt,
    cvt_unit,
    fp16_input,
    fp16_output,
    fp16_to_int16,
    int_to_fp16,
    sign_extend,
    valid_precision_conversions,
)
from hwjax.nvdla._formats import (
    ALIGNMENT,
    check_alignment,
    dc_weight_offsets,
    feature_offsets,
    image_post_extension_factor,
    image_weight_offsets,
    pack_dc_weights,
    pack_feature,
    pack_image_weights,
    pack_sdp_per_channel,
    pack_sdp_per_element,
    pre_extend_image_weights,
    sdp_per_element_offsets,
    unextend_image_weights,
    unpack_dc_weights,
    unpack_feature,
    unpack_image_weights,
    unpack_sdp_per_channel,
    unpack_sdp_per_element,
)
from hwjax.nvdla._sparse import (
    SparseWeights,
    compress_sequence,
    compress_weights,
    decompress_sequence,
    decompress_weights,
    weight_group_elements,
    wgs_image,
)
from hwjax.nvdla._winograd import (
    pack_winograd_transformed,
    pack_winograd_weights,
    unpack_winograd_weights,
    winograd_padded_channels,
    winograd_transform,
    winograd_weight_offsets,
)
from hwjax.nvdla._program import (
    PRESETS,
    FitReport,
    LutReport,
    exp_lut,
    fit_lut,
    linear_layout,
    lrn_lut,
    lut_error,
    plot_lut,
    program_lut,
    quantize_entries,
    reciprocal_lut,
    sigmoid_lut,
    slope_registers,
    sweep,
    tanh_lut,
)

# INT8 layer kernels: conv pipeline (CACC + SDP X1), depthwise, SDP element-wise add, PDP pooling.
from hwjax.nvdla._layers import (
    ALU_ALGOS,
    MAX_CONV_PRODUCTS,
    conv2d_int8,
    depthwise_conv2d_int8,
    pdp_avgpool_int8,
    pdp_maxpool_int8,
    pdp_recip_kernel,
    sdp_add_int8,
    sdp_x,
    sdp_x1,
)
