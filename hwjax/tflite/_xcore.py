"""Converters (and decoders) of xformer's XC custom operators (XS3A)."""
