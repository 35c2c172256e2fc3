"""Studies: scripted experiments over scenarios (``python -m orcasim.studies.NAME``)."""
