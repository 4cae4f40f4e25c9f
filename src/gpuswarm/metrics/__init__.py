"""Metrics out (issue 37): the Prometheus view of runs and experiments.

- ``runstats.py``  one run's figures: a :class:`~gpuswarm.core.runview.RunView` (counts,
  slots, quarantines: the one reducer, through ``ui.watch.Follower``) plus the journal folded
  once from its start for what only grows (attempts, busy time, idle gaps), and the attempt
  records of ended tasks read once each (VRAM peaks, energy, tokens, cost)
- ``research.py``  one experiment's figures (its ledger's replay: ``research.journal``)
- ``sources.py``   the runs and experiments under the PATHs, found again as new ones appear
- ``collector.py`` the ``prometheus_client`` Collector: every series, built at scrape time
  from the objects above (no scan per series); the label policy
- ``gpus.py``      this host's GPUs through the one NVML door (memory, utilisation, energy)
- ``exporter.py``  ``gpuswarm exporter``: a metrics-only HTTP server (no dashboard extra)

Layer: above ``research`` and below ``dashboard`` (which serves the same registry on its
``/metrics``). It only reads.
"""
