"""Op kinds for tensor operators (data movement, reductions, element-wise products)."""
