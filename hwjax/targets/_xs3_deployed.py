"""The xcore.ai runtime of deployed models: xformer's XC ops and the TFLM fallback."""
