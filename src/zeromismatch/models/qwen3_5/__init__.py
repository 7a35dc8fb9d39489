import torch

from .checkpoint import CheckpointError, load_checkpoint, load_state_dict_from_dir, save_checkpoint
from .config import PRESETS, ConfigError, Qwen35Config, get_preset
from .model import Qwen35ForCausalLM

__all__ = [
    "PRESETS",
    "CheckpointError",
    "ConfigError",
    "Qwen35Config",
    "Qwen35ForCausalLM",
    "build_model",
    "get_preset",
    "load_checkpoint",
    "load_state_dict_from_dir",
    "save_checkpoint",
]


def build_model(preset_or_config, numerics: str = "stock", seed: int = 0, device="cpu", dtype=None, **overrides):
    """Build a randomly initialized model (or on the meta device: device='meta', no memory)."""
    cfg = preset_or_config if isinstance(preset_or_config, Qwen35Config) else get_preset(preset_or_config, **overrides)
    with torch.device(device):
        model = Qwen35ForCausalLM(cfg, numerics)
    if device != "meta":
        model.init_weights(seed)
    if dtype is not None:
        model = model.to(dtype)
    return model
