"""Op kinds for xformer's XC operators."""
