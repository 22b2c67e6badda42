"""colibri.codegen: checkpoint import, numpy reference, quantisation, layout and C emission."""

__version__ = "0.1.0"
