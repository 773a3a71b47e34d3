"""Tiny real models and local stand-ins for the demo, the tests and the benchmarks.

torch and transformers are imported lazily: importing this package stays cheap.
"""
