"""XMOS xcore.ai XS3 VPU and lib_nn kernels, bit-exact (spec: shared/spec/xs3.md).

Every function takes ``variant="hardware"`` (default), ``"host"`` or ``"v2021"``.
"""
