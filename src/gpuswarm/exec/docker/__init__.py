"""The ``docker`` backend: every attempt in a container that sees only its GPUs.

:mod:`.devices` turns an attempt's GPUs into ``docker run`` device flags per vendor (NVIDIA's
``--gpus``, CDI, AMD's ``/dev/kfd`` plus the GPU's own render node found through sysfs);
:mod:`.argv` builds the whole ``docker run`` command; :mod:`.cli` runs the docker CLI for
everything else (inspect, kill, rm, ps by name or label); :mod:`.container` is one attempt's handle;
:mod:`.backend` ties them to the Backend seam. See docs/docker.md.
"""
