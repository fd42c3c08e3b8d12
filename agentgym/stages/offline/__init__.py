"""Offline generation and scoring in veRL's formats.

* ``generate.py``: ``agentgym generate`` (veRL's ``main_generation``): sample ``data.n_samples``
  responses per prompt of a parquet file and write them back as a ``responses`` column;
* ``scoring.py``: ``agentgym eval data.path=FILE`` (veRL's ``main_eval``): score such a file with
  each row's reward and print the mean per data source.
"""
