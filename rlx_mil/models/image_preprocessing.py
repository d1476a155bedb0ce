"""What an image encoder expects of its pixels, read from the checkpoint's
`preprocessor_config.json` (transformers' image processor settings) so a package can carry it.

The graph takes pixel values already resized, rescaled and normalised; how is the image
processor's business (`size`, `resample`, `rescale_factor`, `image_mean`, `image_std`, SigLIP2's
`max_num_patches`, ...). `convert-hf` stores these settings as JSON in the package's metadata
under `METADATA_KEY`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlx_mil.errors import CheckpointError
from rlx_mil.models.hf_config import MAX_CONFIG_BYTES, read_json_file

PREPROCESSOR_FILE = "preprocessor_config.json"
#: The package metadata key holding the settings (JSON).
METADATA_KEY = "rlx_mil.image_preprocessing"
#: The image-processor settings that decide the pixel values (transformers' names).
FIELDS = (
    "image_processor_type", "do_convert_rgb", "do_resize", "size", "resample", "do_center_crop", "crop_size",
    "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std", "do_pad", "patch_size",
    "max_num_patches",
)


def is_image_encoder(config: Mapping[str, Any]) -> bool:
    """Whether `config` (a config.json) describes one of the image encoders (DINOv2, SigLIP)."""
    from rlx_mil.errors import RlxMilError
    from rlx_mil.models.families import model_spec
    from rlx_mil.models.hf_config import VisionSpec

    try:
        return isinstance(model_spec(config), VisionSpec)
    except RlxMilError:
        return False


def image_preprocessing(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The image-processor settings of a checkpoint folder (None without a preprocessor_config.json)."""
    file = Path(folder) / PREPROCESSOR_FILE
    if not file.exists() and not file.is_symlink():
        return None
    config = read_json_file(file, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: the top level is not a JSON object")
    return {k: config[k] for k in FIELDS if k in config}


def add_preprocessing_metadata(model: Any, folder: str | os.PathLike[str]) -> bool:
    """Store the folder's image-processor settings in `model`'s metadata; False when it has none."""
    settings = image_preprocessing(folder)
    if not settings:
        return False
    model.user_defined_metadata[METADATA_KEY] = json.dumps(settings, sort_keys=True)
    return True
