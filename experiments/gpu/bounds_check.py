#!/usr/bin/env python
"""Check every memory access of the CUDA forms' kernels on a CPU, without a GPU: Triton's interpreter runs the
kernels and zeromismatch.ops.interpreter.check_bounds() fails any unmasked load, store or atomic outside the
storage of that launch's tensor arguments, naming the kernel and the argument (compute-sanitizer's memcheck, on
the interpreter). The workloads are the engine's hardest paths: tests/generator/test_engine_stress.py's randomized
multi-turn workload (parks, tool turns, one-token pieces at block boundaries, mixed steps, preemption, prefix
hits, weight swaps) through the CUDA-graph runner's bucketed decode path (run without capture) with the Gumbel-max
device sampler, in bi and bi_chunk; then the trainer's packed forward and backward on the same micro model.

    pip install -e ".[interpret]" && TRITON_INTERPRET=1 PYTHONPATH=src python experiments/gpu/bounds_check.py \
        [--seeds 0 1] [--iterations 120] [--modes bi bi_chunk] [--agent 8]

Prints one line per workload (steps, kernel launches and accesses checked, the hard paths reached) and exits
non-zero at the first access out of bounds. tests/ops/test_interpreter.py checks the checker itself and runs a
short form of this (one seed, 40 iterations, no agent workload) in CI.
"""

import argparse
import os
import sys
import time

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1 (zeromismatch.ops.device reads it at import)")

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "tests", "generator"))

from zeromismatch.ops import interpreter  # noqa: E402


def trainer_step(mode: str) -> None:
    """The trainer's scoring (one packed varlen forward, trainer/scoring.py) and its backward, over sequences one
    of which is a single token."""
    from gen_helpers import MICRO, prompts_of

    from zeromismatch.models.qwen3_5 import build_model
    from zeromismatch.trainer.scoring import next_token_logprobs

    model = build_model("tiny", mode, seed=1, **MICRO)
    lps = next_token_logprobs(model, prompts_of([1, 63, 64, 65, 130], seed=3))
    torch.cat(lps).sum().backward()


def agent_workload(mode: str, seed: int, slots: int, rollouts: int, greedy: bool, graphs: bool) -> dict:
    """The terminal agent's engine at its shapes (conf/scale/small_agent.yaml): the qwen3_5_small preset's widths
    and heads in bf16 (2 of its 8 layers, one GDN and one attention: the interpreter runs the recurrent kernel's
    token loop in Python), a 512-token context, 8192 batched tokens; groups of rollouts that share a prompt
    (prefix hits), turns of up to 32 tokens ended by a stop token or the cap, tool output of 1-200 tokens appended
    to a parked sequence, up to 4 turns. greedy: the held-out evaluation's setting (its engine runs eagerly:
    graphs False)."""
    import random

    from test_engine_stress import check_state

    from zeromismatch.generator import Engine, SamplingParams
    from zeromismatch.models.qwen3_5 import build_model
    from zeromismatch.orchestration.build import for_generation

    rng = random.Random(seed)
    model = for_generation(build_model("qwen3_5_small", mode, seed=1, dtype=torch.bfloat16, num_hidden_layers=2,
                                             layer_types=["linear_attention", "full_attention"]))
    vocab = model.config.vocab_size
    eng = Engine(model, max_slots=slots, max_batched_tokens=8192, max_model_len=512, cuda_graphs=graphs,
                 device_sampling=True)
    execute = eng.runner.execute

    def checked_execute(work, tap=None):
        check_state(eng, work)
        return execute(work, tap)

    eng.runner.execute = checked_execute
    stops = tuple(rng.sample(range(vocab), 20))  # ~1% of tokens end a turn: turns of ~1-32 tokens

    def params(i):
        return SamplingParams(temperature=0.0 if greedy else 1.0, max_new_tokens=32, stop_token_ids=stops, seed=i,
                              keep_cache=True, tempered_logprobs=True)

    turns = {}
    group = max(1, rollouts // 2)  # two prompts, each sampled by half the rollouts
    for g in range(0, rollouts, group):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(60, 128))]
        for i in range(g, min(g + group, rollouts)):
            turns[eng.add_request(prompt, params(i))] = 1
    while eng.has_work() or eng.parked:
        if eng.has_work():
            eng.step()
        for rid in list(eng.parked):
            if rng.random() < 0.3:  # the tool is still running
                continue
            seq = eng.parked[rid]
            tool = [rng.randrange(vocab) for _ in range(rng.choice([1, 2, rng.randint(3, 200)]))]
            if turns[rid] < 4 and len(seq.tokens) + len(tool) + 32 <= 512 and rng.random() < 0.8:
                turns[rid] += 1
                eng.continue_request(rid, tool, params(rid))
            else:
                eng.release(rid)
    return {**eng.stats, **eng.runner.stats, "turns": sum(turns.values())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--iterations", type=int, default=120)
    ap.add_argument("--modes", nargs="+", default=["bi", "bi_chunk"])
    ap.add_argument("--agent", type=int, default=0, metavar="ROLLOUTS",
                    help="also the agent-shaped workload with this many rollouts (sampled with graphs, and greedy "
                         "eager as the held-out evaluation)")
    args = ap.parse_args()
    from test_engine_stress import HARD_PATHS, run_workload

    with interpreter.emulate_gpu_arithmetic(), interpreter.check_bounds():
        for mode in args.modes:
            for seed in args.seeds:
                t0, n0, a0 = time.time(), interpreter.stats["launches"], interpreter.stats["accesses"]
                with torch.no_grad():
                    st = run_workload(seed, mode, iterations=args.iterations, device_sampling=True)
                hard = ", ".join(f"{k} {st[k]}" for k in HARD_PATHS)
                print(f"{mode} workload seed {seed}: {st['steps']} steps, "
                      f"{interpreter.stats['launches'] - n0} launches, "
                      f"{interpreter.stats['accesses'] - a0} accesses in bounds ({hard}; {time.time() - t0:.0f} s)",
                      flush=True)
            for greedy in ([False, True] if args.agent else []):
                t0, n0 = time.time(), interpreter.stats["launches"]
                with torch.no_grad():
                    st = agent_workload(mode, 0, slots=2 * args.agent, rollouts=args.agent, greedy=greedy,
                                        graphs=not greedy)
                print(f"{mode} agent workload ({'greedy, eager' if greedy else 'sampled, graphs'}): {st['steps']} "
                      f"steps, {st['turns']} turns, {interpreter.stats['launches'] - n0} launches in bounds "
                      f"(prefix_hit_tokens {st['prefix_hit_tokens']}, mixed_steps {st.get('mixed_steps', 0)}; "
                      f"{time.time() - t0:.0f} s)", flush=True)
            t0, n0 = time.time(), interpreter.stats["launches"]
            trainer_step(mode)
            print(f"{mode} trainer forward + backward: {interpreter.stats['launches'] - n0} launches in bounds "
                  f"({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
