"""The CPU platform: everything a run sets up only where its devices are CPUs, entered through
``setup.set_up`` (``dew.runtime.start`` calls it; on an accelerator nothing here runs).

- ``devices``: one XLA device per core; ``memory``: glibc's malloc keeping a step's freed memory;
- ``flags``: XLA:CPU's convolution library and the CPU-flag rule;
- ``choice``: the kernel decision (forced, recorded with a run, or the rule). Dots are XLA's.
"""
