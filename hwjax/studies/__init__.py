"""Numerical studies: ``python -m hwjax.studies <name>`` (names: see ``STUDIES``).

Each study runs the exact emulators on synthetic (or model) data, prints a markdown
table and writes a PNG plot.
"""

STUDIES = {
    "lt8": "hwjax.studies._lt8",
}

__all__ = ["STUDIES"]
