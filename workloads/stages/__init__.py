"""The four ASAx workflows' stages as real programs, run inside the workflow image.

Each application module (`montage`, `blast`, `statistics`, `synthetic`) exposes:

- ``STAGES``: stage name -> ``function(work_dir, params, progress)``, the stage's work;
- ``SIZES``: named parameter sets, ``test`` (seconds), ``small`` (under a minute
  on two cores) and ``study`` (minutes); ``DEFAULTS`` is ``SIZES["test"]``;
- ``tasks(params)``: stage name -> number of progress units, so the host can
  describe the workflow (tasks feed Hp(t)) without running it;
- ``verify(work_dir, params)``: what is wrong with a finished run's outputs
  (an empty list when they are right), run on the host.

Only the standard library and NumPy are imported here: this package is copied
into the image (Debian's python3 and python3-numpy) and must not need cosched.
Run a stage with ``python3 -m workloads.stages APP STAGE --dir DIR [--set k=v ...]``.
"""
