"""The package version (one place; read by hwjax.__version__ and export manifests)."""

__version__ = "0.1.0"
