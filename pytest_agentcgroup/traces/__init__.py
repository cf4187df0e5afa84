"""Traces: the IR (ir.py), the corpus and its manifest, step kinds, selection, shape and
characterization, fetching, and converters from public formats (convert/).

The bottom room: imports nothing from the rest of the package.
"""
