"""Capture overhead: the step time (forward + backward) of a megatron-core MLP without capture, with capture
in digest mode (per hash asked for) and with full capture, interleaved in one run (the variants take turns
each round, so that load from other processes hits them alike); medians, and each capture's ratio to the
plain step.

    python3 scripts/bench_capture.py [--hidden 512] [--ffn 1024] [--tokens 512] [--dtype bf16|fp32] [--rounds 15]
                                     [--device cpu|cuda] [--hash md5|fast|fast-torch ...] [--no-full] [--optimizer]
                                     [--writer thread|process] [--runs 3] [--baseline DIR] [--summary FILE]

--runs N: N separate runs, one process each after the other (the host's speed varies between processes more than
between rounds of one), each printed as it ends, then per variant the median of the runs' ratios and their range:
the figures a row of the capture guide gives. --summary FILE also writes the runs' figures there (JSON).

--baseline DIR: each run also runs on the checkout at DIR (its scripts/bench_capture.py, its harness first on
PYTHONPATH; e.g. `git worktree add DIR REV`), the two taking turns, then both summaries and per run this code's
ratio over the baseline's: the host's speed drifts between calls by more than a change to the capture's host work
saves, so two versions are compared in one call, run by run. DIR's script must know --figures (since 5da804f) and
the other options given.

--hash md5 fast measures both digest hashes side by side: "md5" (MD5 + XXH3 of a host copy of every tensor)
and "fast" (fast64 and the stats computed where the tensor lives, harness.store.fast_hash: on a GPU one
transfer of a few scalars per tensor, started at cap.step(); on the CPU by numpy in the hook, on the tensor's
own memory, no copy). On CUDA "fast" takes the Triton kernel (harness.frameworks.triton_digest) where triton
is importable; "fast-torch" is the same hash by torch ops (XFALIGN_FAST_DIGEST_KERNEL=torch while that variant
runs), so --hash fast fast-torch times both in one run. --no-full leaves out the full capture (on a large
model it takes seconds per round).

The model: megatron.core.transformer.mlp.MLP (ColumnParallelLinear -> bias SwiGLU -> RowParallelLinear), TP=1
in a one-process gloo group, every module selected (the MLP, linear_fc1, linear_fc2); --model layer / moe-layer:
a whole TransformerLayer (CUDA only); --model gpt: a GPTModel of --layers such layers, --vocab tokens, one sequence
of --tokens, its loss averaged (CUDA only). A step is forward + backward (+ cap.step() when captured) and, on cuda,
a device synchronize (as a training loop's loss.item() would); a round is --steps consecutive steps of one
variant, a captured round inside one `with capture` block whose end (the last step's write, the tree made
durable) is timed too, entering it is not. The result is the time per step: of the whole round, and of its steps
alone (the loop, up to the last step's synchronize; its end not counted), the capture's cost per step when it runs
for many more steps than a round's.
bias_swiglu runs eagerly (torch.compiler "force_eager"): no compile time. On CUDA it also prints how many lists of
tensors were digested together and how many plans and tables they made (harness.frameworks.triton_batch.COUNTS):
a list whose plan is reused costs less host time.
--optimizer: a step ends with an AdamW step (lr 1e-4, clip 1.0), captured too (capture(..., optimizer=):
gradients applied, states, updated parameters): on cuda megatron-core's own optimizer
(Float16OptimizerWithFloat16Params for bf16, with fp32 main parameters; FP32Optimizer for fp32); on the CPU,
where those need CUDA, torch's AdamW (the optimizer megatron-core picks without Transformer Engine or apex)
after torch's clip_grad_norm_.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig

from harness.capture import capture
from harness.frameworks import triton_batch, triton_launch
from harness.frameworks.megatron_group import one_process_group

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs_in_turns import median_range, on_checkout  # noqa: E402

# a --hash variant -> the environment it runs in: fast by the torch ops; fast with Triton's own launch every time
# (harness.frameworks.triton_launch: side by side with "fast", what the direct launches save)
VARIANT_ENVIRONMENT = {"fast-torch": {"XFALIGN_FAST_DIGEST_KERNEL": "torch"},
                       "fast-triton-launch": {triton_launch.LAUNCH_VARIABLE: "triton"}}


def build(hidden: int, ffn: int, dtype: torch.dtype) -> torch.nn.Module:
    config = TransformerConfig(num_layers=1, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=4,
                               gated_linear_unit=True, activation_func=F.silu, add_bias_linear=True,
                               bias_activation_fusion=True, bf16=dtype == torch.bfloat16, params_dtype=dtype,
                               use_cpu_initialization=True, hidden_dropout=0.0, gradient_accumulation_fusion=False)
    return MLP(config, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear))


def build_layer(hidden: int, ffn: int, heads: int, moe: bool, dtype: torch.dtype) -> torch.nn.Module:
    """A megatron-core TransformerLayer of the local spec (RMSNorm, attention, SwiGLU MLP; with `moe` a 4-expert
    top-2 MoE instead of the MLP). Its attention, router and token dispatcher need CUDA."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module

    extra = dict(num_moe_experts=4, moe_router_topk=2, moe_token_dispatcher_type="alltoall", moe_aux_loss_coeff=0.0) if moe else {}
    config = TransformerConfig(num_layers=1, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
                               gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                               bf16=dtype == torch.bfloat16, params_dtype=dtype, hidden_dropout=0.0, attention_dropout=0.0,
                               normalization="RMSNorm", **extra)
    spec = get_gpt_layer_local_spec(num_experts=4 if moe else None, moe_grouped_gemm=False, normalization="RMSNorm")
    return build_module(spec, config=config, layer_number=1)


def build_gpt(hidden: int, ffn: int, heads: int, layers: int, vocab: int, tokens: int, dtype: torch.dtype) -> torch.nn.Module:
    """A megatron-core GPTModel of `layers` local-spec layers (RMSNorm, RoPE, causal attention, SwiGLU MLP), untied
    output layer, vocab-parallel cross entropy (CUDA only, as the layer)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = TransformerConfig(num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
                               gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
                               bf16=dtype == torch.bfloat16, params_dtype=dtype, hidden_dropout=0.0, attention_dropout=0.0,
                               normalization="RMSNorm")
    return GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=vocab, max_sequence_length=tokens,
                    position_embedding_type="rope", share_embeddings_and_output_weights=False)


def model_and_batch(args: argparse.Namespace, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The model --model asks for on --device (inside one_process_group), its input and upstream gradient."""
    if args.device == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.random.model_parallel_cuda_manual_seed(0)
    if args.model == "gpt":  # one sequence of --tokens token ids; the labels: the same shifted by one
        model = build_gpt(args.hidden, args.ffn, args.heads, args.layers, args.vocab, args.tokens, dtype).to(args.device)
        ids = torch.randint(0, args.vocab, (1, args.tokens + 1), device=args.device)
        return model, ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    model = (build(args.hidden, args.ffn, dtype) if args.model == "mlp" else
             build_layer(args.hidden, args.ffn, args.heads, args.model == "moe-layer", dtype)).to(args.device)
    x = torch.randn(args.tokens, 1, args.hidden).to(args.device, dtype).requires_grad_()
    grad = torch.randn(args.tokens, 1, args.hidden).to(args.device, dtype)
    return model, x, grad


def forward_backward(model: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> None:
    for param in model.parameters():
        param.grad = None
    if type(model).__name__ == "GPTModel":  # x: token ids, grad: the labels; the per-token loss, averaged
        model(x, torch.arange(x.shape[1], device=x.device)[None], None, labels=grad).mean().backward()
        return
    result = model(x) if isinstance(model, MLP) else model(x, attention_mask=None)
    output, bias = result  # the MLP's (output, bias); a layer's (output, context), context None
    (output if bias is None else output + bias).backward(grad)


def make_optimizer(model: torch.nn.Module, device: str, dtype: torch.dtype):
    """AdamW as megatron-core runs it on `device` (see the module's note)."""
    inner = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if device != "cuda":
        return inner
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params, FP32Optimizer

    config = OptimizerConfig(optimizer="adam", lr=1e-4, clip_grad=1.0, bf16=dtype == torch.bfloat16)
    if dtype == torch.bfloat16:
        return Float16OptimizerWithFloat16Params(inner, config, grad_scaler=None, init_state_fn=None)
    return FP32Optimizer(inner, config, init_state_fn=None)


OPTIMIZER = None  # set by main() with --optimizer
WRITER = "thread"  # set by main(): --writer


def train_step(model: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, cap=None) -> None:
    forward_backward(model, x, grad)
    if OPTIMIZER is not None:
        if isinstance(OPTIMIZER, torch.optim.Optimizer):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        else:  # megatron-core's optimizer reads main_grad, which its DDP wrapper (not used here) provides
            for param in model.parameters():
                param.main_grad = param.grad
        OPTIMIZER.step()  # a captured step ends here
    elif cap is not None:
        cap.step()
    if x.is_cuda:
        torch.cuda.synchronize()


def timed(model, x, grad, variant: tuple[str, str] | None, folder: Path, steps: int) -> tuple[float, float]:
    """Seconds per step over `steps` consecutive steps: of the whole round, whose clock, captured, stops when
    its `with capture` block has ended (the last step written, the tree made durable); and of the steps alone."""
    if variant is None:
        start = time.perf_counter()
        for _ in range(steps):
            train_step(model, x, grad)
        seconds = (time.perf_counter() - start) / steps
        return seconds, seconds
    mode, hash_ = variant
    settings = VARIANT_ENVIRONMENT.get(hash_, {})
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    if settings:
        triton_launch.forget()  # XFALIGN_TRITON_LAUNCH read again
    try:
        with capture(model, folder / f"{mode}-{hash_}", mode=mode, hash=hash_.split("-")[0], optimizer=OPTIMIZER,
                     writer=WRITER) as cap:
            start = time.perf_counter()
            for _ in range(steps):
                train_step(model, x, grad, cap)
            loop = time.perf_counter() - start
        seconds = time.perf_counter() - start
    finally:
        for name, value in previous.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
        if settings:
            triton_launch.forget()
    return seconds / steps, loop / steps


def options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=512, help="sequence length x batch")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4, help="consecutive training steps per round and variant")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=("mlp", "layer", "moe-layer", "gpt"), default="mlp",
                        help="the MLP, a whole TransformerLayer (dense or MoE; CUDA only), or a GPTModel (CUDA only)")
    parser.add_argument("--layers", type=int, default=8, help="--model gpt: its layers")
    parser.add_argument("--vocab", type=int, default=32000, help="--model gpt: its vocabulary")
    parser.add_argument("--heads", type=int, default=32, help="attention heads of --model layer / moe-layer")
    parser.add_argument("--hash", choices=("md5", "fast", *VARIANT_ENVIRONMENT), nargs="+", default=["md5"],
                        help="the digest mode's hash(es), each a variant (fast-torch: fast by the torch ops on CUDA; "
                             "fast-triton-launch: fast with Triton's own launch every time)")
    parser.add_argument("--no-full", action="store_true", help="leave out the full capture variant")
    parser.add_argument("--optimizer", action="store_true", help="an AdamW step in every step, captured too")
    parser.add_argument("--writer", choices=("thread", "process"), default="thread",
                        help="the capture's writer (capture(writer=...)); a process is started once, in the warm-up")
    parser.add_argument("--runs", type=int, default=1, help="separate runs (a process each), then the median and range "
                                                            "of their ratios")
    parser.add_argument("--baseline", type=Path, help="a checkout to run each run on too, taking turns; then per run "
                                                      "this code's ratio over its ratio")
    parser.add_argument("--summary", type=Path, help="with --runs or --baseline: write the runs' figures to this JSON "
                                                     "file ({\"runs\": [...], \"baseline\": [...]}: per run, part and "
                                                     "variant, its ms per step and ratio)")
    parser.add_argument("--figures", type=Path, help=argparse.SUPPRESS)  # a run of --runs writes its figures here
    return parser


def main() -> None:
    args = options().parse_args()
    if args.figures is None and (args.runs > 1 or args.baseline is not None):
        runs_apart(args.runs, args.baseline, args.summary)
        return
    global WRITER
    WRITER = args.writer
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.compiler.set_stance("force_eager")
    torch.manual_seed(0)
    load = os.getloadavg()
    modes: list[tuple[str, str] | None] = [None, *(("digest", h) for h in dict.fromkeys(args.hash))]
    if not args.no_full:
        modes.append(("full", "md5"))
    times: dict[tuple[str, str] | None, list[tuple[float, float]]] = {mode: [] for mode in modes}
    with one_process_group(args.device), tempfile.TemporaryDirectory() as tmp:
        model, x, grad = model_and_batch(args, dtype)
        if args.optimizer:
            global OPTIMIZER
            OPTIMIZER = make_optimizer(model, args.device, dtype)
        for mode in modes:  # warm-up: first calls, allocator, the capture's imports
            timed(model, x, grad, mode, Path(tmp), args.steps)
        for round_ in range(args.rounds):
            turn = round_ % len(modes)
            for mode in modes[turn:] + modes[:turn]:  # a different variant first each round
                times[mode].append(timed(model, x, grad, mode, Path(tmp), args.steps))
        written = sum(f.stat().st_size for f in (Path(tmp) / "full-md5").rglob("*") if f.is_file()) / args.steps \
            if not args.no_full else 0
    params = sum(p.numel() for p in model.parameters())
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else f"{torch.get_num_threads()} torch threads"
    optimizer = f", optimizer {type(OPTIMIZER).__name__}" if OPTIMIZER is not None else ""
    optimizer += f", writer {WRITER}"
    print(f"megatron-core {args.model}{optimizer} hidden {args.hidden}, ffn {args.ffn}, tokens {args.tokens}, {args.dtype}, {args.device}, "
          f"{params:,} parameters, {where}; median of {args.rounds} rounds of {args.steps} steps")
    print(("no full capture; " if args.no_full else f"full capture writes {written / 2**20:.1f} MiB per step; ") +
          f"load average before {load[0]:.2f}, after "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (other processes slow every variant alike)")
    figures: dict[str, dict[str, list[float]]] = {}  # part -> variant -> [median ms, ratio to the plain step]
    for part, what in ((0, "whole round (a capture's end included)"), (1, "its steps alone (the loop)")):
        print(f"  per step, {what}:")
        plain = statistics.median(t[part] for t in times[None])
        for mode in modes:
            values = [t[part] for t in times[mode]]
            median = statistics.median(values)
            label = "no capture" if mode is None else "capture, full" if mode[0] == "full" else f"capture, digest {mode[1]}"
            figures.setdefault(PARTS[part], {})[label] = [median * 1e3, median / plain]
            print(f"    {label:<27} {median * 1e3:8.1f} ms   x{median / plain:.2f}   "
                  f"(min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f})")
    if args.figures is not None:
        args.figures.write_text(json.dumps(figures))
    counts = triton_batch.COUNTS
    if counts["lists"]:  # whether the step's lists reuse their plans: a new plan per list costs more host time
        print(f"  lists digested together (parameters, gradients, optimizer states; every round, the warm-up too): "
              f"{counts['lists']}, plans made {counts['plans']}, tables made {counts['tables']}")


PARTS = ("whole round", "loop")


def runs_apart(runs: int, baseline: Path | None = None, figures_to: Path | None = None) -> None:
    """Run this script `runs` times with the same options, one process after the other (their output as it comes),
    then print `summary` of their figures; with `baseline`, each run on that checkout too (`baseline_command`; the
    baseline first in the first run, then the two taking turns), and then `paired_summary`. With `figures_to`, the
    runs' figures are written there too."""
    if baseline is not None and not (baseline / "scripts" / "bench_capture.py").is_file():
        raise SystemExit(f"bench_capture: --baseline {baseline}: no scripts/bench_capture.py there (a checkout of xfalign, "
                         "e.g. made by `git worktree add`)")
    found: list[dict] = []
    based: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            turns = [("this code", found)] if baseline is None else \
                [("this code", found), ("the baseline", based)][::1 if run % 2 else -1]
            for who, into in turns:
                print(f"run {run + 1} of {runs}" + ("" if baseline is None else f", {who}") + ":", flush=True)
                figures = Path(tmp) / f"run-{run}-{'new' if into is found else 'base'}.json"
                if into is found:
                    subprocess.run(run_command(sys.argv[1:], figures), check=True)
                else:
                    assert baseline is not None
                    command, environment = baseline_command(sys.argv[1:], figures, baseline)
                    subprocess.run(command, check=True, env=environment)
                into.append(json.loads(figures.read_text()))
    if figures_to is not None:
        figures_to.write_text(json.dumps({"runs": found, "baseline": based if baseline is not None else None}))
    if baseline is None:
        print(summary(found))
        return
    print(f"this code:\n{summary(found)}\nthe baseline ({baseline}):\n{summary(based)}\n{paired_summary(found, based)}")


def run_command(argv: list[str], figures: Path) -> list[str]:
    """One run of `runs_apart`: these options, then --runs 1 (argparse keeps an option's last value, whichever
    spelling came before: --runs=3, --run 3) and where to write its figures (which makes it a single run)."""
    return [sys.executable, __file__, *argv, "--runs", "1", "--figures", str(figures)]


def baseline_command(argv: list[str], figures: Path, baseline: Path) -> tuple[list[str], dict[str, str]]:
    """One run of `runs_apart` on the checkout `baseline`: its script with these options but --baseline (which it may
    not know; taken out by argparse's own matching, any spelling), and an environment whose PYTHONPATH starts there."""
    rest, environment = on_checkout(argv, ("--baseline", "--summary"), baseline)
    script = baseline.resolve() / "scripts" / "bench_capture.py"
    return [sys.executable, str(script), *rest, "--runs", "1", "--figures", str(figures)], environment


def summary(runs: list[dict[str, dict[str, list[float]]]]) -> str:
    """Per part and variant, over the runs: the median of the runs' ratios to their plain step, and their range (a
    run's ratio is its rounds' median over its plain rounds' median); the plain step's range in ms."""
    lines = [f"over {len(runs)} runs, each a process of its own: the median of the runs' ratios (their range)"]
    for part in PARTS:
        lines.append(f"  per step, {part}:")
        for label in runs[0][part]:
            ms = [run[part][label][0] for run in runs]
            ratios = [run[part][label][1] for run in runs]
            figure = f"{min(ms):.1f}-{max(ms):.1f} ms" if label == "no capture" else \
                median_range(ratios)
            lines.append(f"    {label:<27} {figure}")
    return "\n".join(lines)


def paired_summary(runs: list[dict[str, dict[str, list[float]]]], baseline: list[dict[str, dict[str, list[float]]]]) -> str:
    """Per part and capture variant, run by run (a run of this code and the baseline's run of the same turn): the
    median and range of this code's ratio over the baseline's ratio (below 1: this code costs less)."""
    lines = [f"this code against the baseline, run by run ({len(runs)} pairs): the median of this code's ratio over the "
             "baseline's (their range)"]
    for part in PARTS:
        lines.append(f"  per step, {part}:")
        for label in runs[0][part]:
            if label == "no capture" or label not in baseline[0][part]:
                continue
            over = [run[part][label][1] / base[part][label][1] for run, base in zip(runs, baseline, strict=True)]
            lines.append(f"    {label:<27} {median_range(over, 3)}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
