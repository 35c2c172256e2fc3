"""``orcasim serve``: a scenario's engine behind an OpenAI-compatible HTTP endpoint, in real time.

- :mod:`orcasim.serve.live`: the engine in a real-time SimPy environment on a
  thread of its own, fed by requests submitted from outside;
- :mod:`orcasim.serve.api`: the OpenAI request bodies read and the answers written;
- :mod:`orcasim.serve.server`: the aiohttp application (completions, chat,
  models, health, metrics);
- :mod:`orcasim.serve.metrics`: ``/metrics`` with vLLM's metric names;
- :mod:`orcasim.serve.run`: serve until a signal, then the usual outputs.

Needs the ``serve`` extra (``pip install 'orcasim[serve]'``: aiohttp and prometheus-client).
"""
