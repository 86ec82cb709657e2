"""orbax-checkpoint save / restore of the training state (model, optimiser, progress)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp


class Checkpoints:
    """Numbered checkpoints under ``folder``: the model state, the optimiser state (as
    flat leaf lists, restored into the current structures) and a JSON progress record."""

    def __init__(self, folder, max_to_keep: int = 2):
        self.folder = Path(folder).absolute()
        self.manager = ocp.CheckpointManager(
            self.folder, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        )

    def latest(self) -> Optional[int]:
        return self.manager.latest_step()

    def save(self, step: int, model_state, opt_state, meta: dict) -> None:
        tree = {
            "model": [np.asarray(a) for a in jax.tree.leaves(model_state)],
            "opt": [np.asarray(a) for a in jax.tree.leaves(opt_state)],
        }
        self.manager.save(
            step, args=ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta))
        )
        self.manager.wait_until_finished()

    def restore_meta(self, step: int) -> dict:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, model_state, opt_state) -> tuple[Any, Any, dict]:
        """Restores into the structures of ``model_state`` / ``opt_state`` (``opt_state``
        None: the saved optimiser state is not restored)."""
        meta = self.restore_meta(step)
        got = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
        got = {k: [np.asarray(a) for a in got[k]] for k in ("model", "opt")}
        want = jax.tree.leaves(model_state)
        if [a.shape for a in got["model"]] != [np.shape(a) for a in want]:
            raise ValueError("the checkpoint's model state does not match this model (another --model?)")
        model_state = jax.tree.unflatten(jax.tree.structure(model_state), got["model"])
        if opt_state is not None:
            leaves = jax.tree.leaves(opt_state)
            if len(leaves) != len(got["opt"]):
                raise ValueError(
                    "the checkpoint's optimiser state does not match the current optimiser "
                    "(was it saved with another --optimizer?)"
                )
            opt_state = jax.tree.unflatten(jax.tree.structure(opt_state), got["opt"])
        return model_state, opt_state, meta
