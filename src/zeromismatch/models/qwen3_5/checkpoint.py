"""Qwen3.5 checkpoints in the Hugging Face on-disk layout.

Save writes config.json (the text config), model-0000i-of-0000n.safetensors shards and
model.safetensors.index.json, with tensor names exactly as transformers' Qwen3_5ForCausalLM /
Qwen3_5MoeForCausalLM name them (routed experts fused: gate_up_proj [E, 2I, H], down_proj [E, H, I]).

The model computes two pairs of projections as one GEMM each (mlp gate_up_proj = [gate_proj; up_proj], GDN
in_proj_ba = [in_proj_b; in_proj_a]); save splits them and load concatenates them (`checkpoint_tensors`).

Load accepts our saves, transformers' text-only saves (sharded or a single model.safetensors) and the published
multimodal layout (Qwen3_5ForConditionalGeneration: text weights under model.language_model., config under
text_config); the vision tower (model.visual.) and the multi-token-prediction head (mtp.) are skipped. Routed
experts may be fused or stored per expert (mlp.experts.{j}.{gate,up,down}_proj.weight), which are stacked.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ...errors import InputFileError, MissingFileError, read_json
from .config import Qwen35Config
from .model import Qwen35ForCausalLM

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_FILE_NAME = "model.safetensors"
SKIPPED_PREFIXES = ("model.visual.", "mtp.")  # parts of the published checkpoint outside the text model
_MULTIMODAL_PREFIX = "model.language_model."
_PER_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.\d+\.(?:gate|up|down)_proj\.weight$")
# projections this model computes as one GEMM (as vLLM does) and checkpoints store as two row halves, in order
_MERGED = {"gate_up_proj.weight": ("gate_proj.weight", "up_proj.weight"),
           "in_proj_ba.weight": ("in_proj_b.weight", "in_proj_a.weight")}


class CheckpointError(RuntimeError):
    """The checkpoint's tensors do not fit the model (missing, unexpected or misshapen tensors)."""


# ------------------------------------------------------------------------------------------ save


def save_checkpoint(model: Qwen35ForCausalLM, out_dir: str | Path, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write `model` to `out_dir` as config.json + safetensors shards of at most `max_shard_bytes` (a tensor larger
    than that gets a shard of its own) + the index. Tensors keep their dtype; a tied lm_head is not stored."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    tensors = checkpoint_tensors(model.state_dict())
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight")

    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes

    for stale in [*out.glob("model-*-of-*.safetensors"), out / SINGLE_FILE_NAME]:  # left by an earlier save
        stale.unlink(missing_ok=True)
    weight_map = {}
    for i, names in enumerate(shards):
        file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k].contiguous().cpu() for k in names}, out / file_name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file_name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _write_json(out / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})

    hf = cfg.to_hf_dict()
    hf["dtype"] = str(model.model.embed_tokens.weight.dtype).removeprefix("torch.")
    _write_json(out / CONFIG_NAME, hf)
    return out


def merged_parts(name: str) -> tuple[str, str] | None:
    """The checkpoint names of a merged parameter's two row halves (mlp gate_up_proj -> gate_proj, up_proj; GDN
    in_proj_ba -> in_proj_b, in_proj_a), or None for a parameter stored as it is."""
    for merged, parts in _MERGED.items():
        if name.endswith("." + merged):
            prefix = name[: -len(merged)]
            return prefix + parts[0], prefix + parts[1]
    return None


def merged_half(name: str) -> tuple[str, int] | None:
    """For a checkpoint name that is half of a merged parameter: (that parameter's name, 0 or 1); else None."""
    for merged, parts in _MERGED.items():
        for i, part in enumerate(parts):
            if name.endswith("." + part):
                return name[: -len(part)] + merged, i
    return None


def checkpoint_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's tensors under the checkpoint's names: merged projections split into their halves (copies: a
    safetensors file holds no two views of one storage)."""
    out = {}
    for name, t in state_dict.items():
        parts = merged_parts(name)
        if parts is None:
            out[name] = t
        else:
            for part, half in zip(parts, t.chunk(2)):
                out[part] = half.clone()
    return out


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------ load


def load_checkpoint(
    path: str | Path, numerics: str = "stock", device="cpu", dtype: torch.dtype | None = None
) -> Qwen35ForCausalLM:
    """Build the model from `path`/config.json on the meta device and materialize it from the checkpoint's
    tensors (on `device`, in `dtype`, or as stored when dtype is None): no memory beyond the weights."""
    path = _checkpoint_dir(path)
    config_file = path / CONFIG_NAME
    if not config_file.is_file():
        raise MissingFileError(f"no {CONFIG_NAME} in checkpoint directory {path}")
    cfg = Qwen35Config.from_hf_dict(read_json(config_file, "a model config object"), source=str(config_file))
    with torch.device("meta"):
        model = Qwen35ForCausalLM(cfg, numerics)
    load_state_dict_from_dir(model, path, device=device, dtype=dtype)
    return model


@torch.no_grad()
def load_state_dict_from_dir(
    model: Qwen35ForCausalLM, path: str | Path, strict: bool = True, *, device=None, dtype: torch.dtype | None = None
) -> None:
    """Load the checkpoint in `path` into `model`. Materialized parameters are copied into (keeping their dtype and
    device); parameters on the meta device are replaced by the loaded tensors, moved to `device` (default cpu) and
    cast to `dtype` (default: as stored). strict=False tolerates missing tensors (those parameters are left as they
    are) and unexpected ones, never a wrong shape. Shapes are checked before anything is loaded."""
    path = _checkpoint_dir(path)
    files = _tensor_files(path)  # checkpoint name -> file
    names = {_our_name(key): key for key in files if not key.startswith(SKIPPED_PREFIXES)}  # ours -> checkpoint's
    per_expert = {m.group(1) for n in names if (m := _PER_EXPERT.match(n))}  # experts stored one by one

    params = dict(model.named_parameters(remove_duplicate=False))
    if model.config.tie_word_embeddings:  # lm_head is embed_tokens: a stored copy is ignored, as transformers does
        params.pop("lm_head.weight")
        names.pop("lm_head.weight", None)
    plan = {target: _sources(target, p.shape, per_expert) for target, p in params.items()}

    used = {src for sources, _ in plan.values() for src, _ in sources}
    missing = sorted(src for src in used if src not in names)
    unexpected = sorted(names[n] for n in names.keys() - used)
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"checkpoint {path} does not match the model:"
            + (f"\n  missing {len(missing)} tensor(s): {_few(missing)}" if missing else "")
            + (f"\n  {len(unexpected)} unexpected tensor(s): {_few(unexpected)}" if unexpected else "")
        )
    plan = {t: (s, kind) for t, (s, kind) in plan.items() if all(src in names for src, _ in s)}

    with ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(path / f, "pt", device="cpu")) for f in sorted(set(files.values()))}

        def handle(src: str):  # the open file holding tensor `src` (our name)
            return handles[files[names[src]]]

        bad = [
            f"{names[src]}: model expects {tuple(shape)}, checkpoint has {found}"
            for sources, _ in plan.values()
            for src, shape in sources
            if (found := tuple(handle(src).get_slice(names[src]).get_shape())) != tuple(shape)
        ]
        if bad:
            lines = "\n  ".join(bad[:5])
            raise CheckpointError(f"checkpoint {path}: {len(bad)} tensor(s) of the wrong shape:\n  {lines}")

        assigned = {}
        for target, (sources, kind) in plan.items():
            t = _combine(kind, [handle(src).get_tensor(names[src]) for src, _ in sources])
            p = params[target]
            if p.is_meta:
                assigned[target] = t.to(device=device or "cpu", dtype=dtype if t.is_floating_point() else None)
            else:
                p.copy_(t)
            del t
        if assigned:
            model.load_state_dict(assigned, strict=False, assign=True)
    if model.config.tie_word_embeddings:  # assign replaced embed_tokens.weight: tie again
        model.lm_head.weight = model.model.embed_tokens.weight


def _checkpoint_dir(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise MissingFileError(f"checkpoint directory {path} does not exist")
    return path


def _tensor_files(path: Path) -> dict[str, str]:
    """Tensor name -> file name, read from the files' headers (the index only says which files to read)."""
    index = path / INDEX_NAME
    if index.is_file():
        weight_map = read_json(index, "a safetensors index object").get("weight_map")
        if not isinstance(weight_map, dict):
            raise InputFileError(f"{index}: no weight_map object (tensor name -> file name)")
        file_names = sorted(set(weight_map.values()))
    elif (path / SINGLE_FILE_NAME).is_file():
        file_names = [SINGLE_FILE_NAME]
    else:
        raise FileNotFoundError(f"no {INDEX_NAME} or {SINGLE_FILE_NAME} in checkpoint directory {path}")
    files = {}
    for file_name in file_names:
        if not (path / file_name).is_file():
            raise FileNotFoundError(f"{index} lists {file_name}, which is not in {path}")
        with safe_open(path / file_name, "pt") as f:
            files.update(dict.fromkeys(f.keys(), file_name))
    return files


def _our_name(key: str) -> str:
    return "model." + key.removeprefix(_MULTIMODAL_PREFIX) if key.startswith(_MULTIMODAL_PREFIX) else key


def _sources(target: str, shape: torch.Size, per_expert: set[str]):
    """The checkpoint tensors (our names) that make up parameter `target`, each with its expected shape, and how
    to combine them: "copy", "cat" (a merged projection's halves), or for experts stored one by one "gate_up"
    (stack over experts of cat(gate, up)) and "stack"."""
    if parts := merged_parts(target):
        return [(part, (shape[0] // 2, *shape[1:])) for part in parts], "cat"
    base, _, leaf = target.rpartition(".")
    if base not in per_expert:
        return [(target, tuple(shape))], "copy"
    e = shape[0]
    if leaf == "gate_up_proj":  # [E, 2I, H]
        per = (shape[1] // 2, shape[2])
        return [(f"{base}.{j}.{proj}_proj.weight", per) for j in range(e) for proj in ("gate", "up")], "gate_up"
    return [(f"{base}.{j}.down_proj.weight", tuple(shape[1:])) for j in range(e)], "stack"


def _combine(kind: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    if kind == "copy":
        return tensors[0]
    if kind == "cat":
        return torch.cat(tensors)
    if kind == "gate_up":
        return torch.stack([torch.cat(tensors[i : i + 2]) for i in range(0, len(tensors), 2)])
    return torch.stack(tensors)


def _few(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")
