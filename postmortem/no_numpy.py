"""Imported first by the parsing workers' server that the ``analyze`` command starts
(``workers.start_early``): NumPy is never imported there (``workers.without_numpy``)."""

from .workers import without_numpy

without_numpy()
