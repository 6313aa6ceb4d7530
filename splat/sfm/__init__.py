"""Structure from motion: a folder of unposed photos -> a scene ``train.py`` reads.

See :mod:`splat.sfm.colmap_pipeline` (pycolmap: features, matching,
incremental mapping, undistortion) and ``convert.py`` (its command line).
"""

from .colmap_pipeline import (
    CAMERA_MODELS,
    IMAGE_EXTENSIONS,
    MATCHERS,
    ConvertResult,
    SfmError,
    convert,
    find_images,
    import_pycolmap,
)

__all__ = [
    "convert",
    "ConvertResult",
    "SfmError",
    "find_images",
    "import_pycolmap",
    "CAMERA_MODELS",
    "IMAGE_EXTENSIONS",
    "MATCHERS",
]
