"""Scenario files shipped with orcasim (installed as the package ``orcasim.scenarios``)."""
