"""Code that runs on a host, shipped as one zipapp; its rules: ARCHITECTURE.md."""

__version__ = "0.1.0"
