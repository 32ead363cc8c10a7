"""The four ASAx workflows' stages as real programs, run inside the workflow image.

Each application module (`montage`, `blast`, `statistics`, `synthetic`) exposes:

- ``STAGES``: stage name -> ``function(work_dir, params, progress)``, the stage's work;
- ``DEFAULTS``: the size parameters and their default (test-sized) values;
- ``tasks(params)``: stage name -> number of progress units, so the host can
  describe the workflow (tasks feed Hp(t)) without running it.

Only the standard library and NumPy are imported here: this package is copied
into the image (Debian's python3 and python3-numpy) and must not need cosched.
Run a stage with ``python3 -m workloads.stages APP STAGE --dir DIR [--set k=v ...]``.
"""
