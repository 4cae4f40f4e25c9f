"""gpuswarm: keep every GPU of a machine busy with long, independent jobs, and lose none of them."""

__version__ = "0.1.0"
