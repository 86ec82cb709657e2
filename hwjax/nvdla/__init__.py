"""NVIDIA NVDLA: LUT unit, convertors and in-memory formats, bit-exact (spec: shared/spec/nvdla.md)."""
