"""Slurm (issue 36, docs/cluster.md): a run inside an allocation (``salloc``/``sbatch``).

:mod:`.allocation` reads the job (its nodes, this node, the time it has left) through Slurm's
own commands; :mod:`.workers` starts ``gpuswarm work`` on the allocation's other nodes with
``srun --overlap`` after checking they see the run folder. The engine composes them; the
supervisor only gets the numbers (the allocation's end: what it may claim, when it stops).
"""
