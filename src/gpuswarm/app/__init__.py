"""What a run is made of and what is done to it: the engine, its setup and outputs, the control
operations, the public api (docs/architecture.md)."""
