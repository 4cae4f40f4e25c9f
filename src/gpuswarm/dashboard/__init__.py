"""``gpuswarm dashboard``: a local web dashboard of runs and research experiments, live.

Layers: above ``research`` and ``api`` (it reads experiments), below the CLI. It reads runs only
through the one read model (``store.reader.RunReader``, ``core.runview.RunView`` folded by
``ui.watch.Follower``), experiments through ``research.journal``/``readouts``, and acts only
through queue control's functions (``app.control``). Its web dependencies (Starlette, uvicorn)
are the ``dashboard`` extra and load only when the command runs.

- ``command.py``  the click command (imports nothing of the web stack until it runs)
- ``server.py``   the Starlette app, its routes, the poller, uvicorn and its shutdown
- ``security.py`` the URL's token -> a session (no cookie), Host allowlist, Origin check for
  actions, CSP headers
- ``sse.py``      Server-Sent Events: framing, wake-ups, streams
- ``catalog.py``  the runs and experiments under the PATHs, found again as new ones appear
- ``runhub.py``   one run followed: lanes, Gantt bars, snapshots and updates by journal offset
- ``taskindex.py`` the task table, paged, sorted and filtered on the server
- ``taskview.py`` one task: its record and its log followed across attempts
- ``experiments.py`` one experiment: ledger replay, variants in flight, diffs
- ``actions.py``  cancel, retry, pause, unpause, priority, add: ``app.control``
- ``gpustats.py`` NVML utilisation and memory
- ``static/``     the page: index.html, app.js, app.css (no build step, no CDN)
"""
