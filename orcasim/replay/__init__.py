"""Replaying measured vLLM runs: read a run, build its scenario, compare the prediction.

:mod:`.measured` reads a run directory, :mod:`.scenario` maps its engine
arguments to a scenario, :mod:`.compare` writes the comparison and
:mod:`.plots` draws it; ``orcasim replay-vllm`` (:mod:`orcasim.commands.replay`)
puts them together.
"""
