"""Meshes from a trained model (needs open3d: the ``mesh`` extra).

- :mod:`splat.mesh.views`: the depth and colour each train view contributes;
- :mod:`splat.mesh.tsdf`: bounded TSDF fusion (open3d ``VoxelBlockGrid``);
- :mod:`splat.mesh.unbounded`: the whole scene in contracted space;
- :mod:`splat.mesh.cleanup`: surfaces no view sees, small clusters;
- :mod:`splat.mesh.extract`: a run's mesh, as ``render.py --mesh`` writes it;
- :mod:`splat.mesh.open3d_import`: open3d, or a one-line fix when it cannot load.
"""

from .cleanup import keep_large_clusters, observe_vertices, remove_unseen
from .extract import MeshOptions, extract_mesh
from .open3d_import import MissingOpen3D, import_open3d
from .tsdf import fuse_tsdf
from .unbounded import contract, extract_unbounded, uncontract
from .views import FusionView, fused_depth, render_fusion_views

__all__ = [
    "FusionView",
    "MeshOptions",
    "MissingOpen3D",
    "contract",
    "extract_mesh",
    "extract_unbounded",
    "fuse_tsdf",
    "fused_depth",
    "import_open3d",
    "keep_large_clusters",
    "observe_vertices",
    "remove_unseen",
    "render_fusion_views",
    "uncontract",
]
