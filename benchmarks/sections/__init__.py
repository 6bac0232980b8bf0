"""One module per benchmark section: its ``bench(h)`` (rows, targets) and its ``WORKERS``.

``run.py`` runs the sections in its ``SECTIONS`` order; a worker named in a section's ``WORKERS``
runs in a subprocess of its own (``worker.py``), importing only its module.
"""
