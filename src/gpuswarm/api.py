"""The public facade by its public name (``from gpuswarm import api``): the module
:mod:`gpuswarm.app.api` itself, not a copy (what a client reads or sets on one is the other's).
"""  # rewrite: keep

import sys

from gpuswarm.app import api as _api
from gpuswarm.app.api import *  # noqa: F403  (its names, for type checkers)

sys.modules[__name__] = _api
