"""Leave torch.distributed as a test found it: more than one test module forms a gloo group in this process."""
from __future__ import annotations


def destroy_process_group() -> None:
    """Destroy the default group and DeepSpeed's cached groups of it.

    DeepSpeed keeps the groups it derived from the default one; a later init in this process
    would be handed those dead groups ("Group ... is not registered").
    """
    import torch.distributed as dist
    from deepspeed.utils import groups

    if dist.is_initialized():
        dist.destroy_process_group()
    for name in ("_WORLD_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP",
                 "_ZERO_PARAM_INTRA_PARALLEL_GROUP"):
        setattr(groups, name, None)
