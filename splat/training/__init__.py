"""The pieces of a training run that :class:`splat.trainer.Trainer` (the loop) puts together.

* :mod:`.capability`: which configs train on several processes, and which
  render their batches sharded;
* :mod:`.views`: the seeded view order and a step's batch of views;
* :mod:`.targets`: what a camera's loss compares (background, target image,
  appearance-corrected render);
* :mod:`.batch_rendering`: the rendering seam, camera by camera or sharded;
* :mod:`.step`: one optimisation step over a batch of cameras, the losses
  written once;
* :mod:`.initial_model`: the model a fresh run starts from;
* :mod:`.triage`: an error explained by a lost peer process.
"""
