"""Hardware-aware training demo and the ``hwjax`` command line (``python -m train``)."""
