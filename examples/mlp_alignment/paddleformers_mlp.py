"""The Paddle side as a released library writes it: PaddleFormers 1.2.0's LLaMA MLP
(`paddleformers.nn.mlp.MLP`, the class `paddleformers.transformers.llama.modeling.LlamaDecoderLayer` builds
as `self.mlp`) and its decoder layer, against the megatron-core MLP with no biases (LLaMA has none).

    python3 examples/mlp_alignment/paddleformers_mlp.py [--out DIR]

PaddleFormers is not installed into site-packages: its dependencies would replace numpy 2.4.6 with 1.26.4
and ml_dtypes 0.6.0 with 0.5.4. Its wheel and the few pure-Python packages its LLaMA modules import are
installed with --no-deps into a folder of their own (scripts/setup.sh; configs/paddleformers-cpu.txt), which
is appended to sys.path: packages already installed keep precedence, torch/paddle/numpy are untouched.

Paddle 3.3.1 has no CPU bf16 kernel for matmul (`linear`), so the released layers run in fp32 here and the
Megatron side is built in fp32 too. The decoder layer runs on CPU with `fuse_rms_norm=False` (the fused
RMSNorm kernel is GPU only); Megatron's TransformerLayer does not run on CPU (README), so only Paddle's is
captured.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
MAP = HERE / "map_llama.yaml"
VERSION = "1.2.0"
# `pip install --no-deps --target build/paddleformers -r` this file (scripts/setup.sh): what its LLaMA modules
# import, pinned; the rest PaddleFormers requires (datasets, librosa, ...) they do not.
PADDLEFORMERS_REQUIREMENTS = HERE.parent.parent / "configs" / "paddleformers-cpu.txt"
PATH_VARIABLE = "XFALIGN_PADDLEFORMERS_PATH"
DEFAULT_PATH = HERE.parent.parent / "build" / "paddleformers"
sys.path.insert(0, str(HERE))

from harness.store.tree_format import ROOT, call_tensor  # noqa: E402


def paddleformers_path() -> Path:
    return Path(os.environ.get(PATH_VARIABLE) or DEFAULT_PATH)


def import_llama() -> ModuleType:
    """paddleformers.transformers.llama.modeling, from site-packages or the folder of `paddleformers_path()`.
    ImportError (naming the folder and the missing module) when neither has it."""
    folder = paddleformers_path()
    if folder.is_dir() and str(folder) not in sys.path:
        sys.path.append(str(folder))  # last: installed packages win
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import paddleformers
            from paddleformers.transformers.llama import modeling
    except ImportError as error:
        raise ImportError(f"PaddleFormers {VERSION} is not importable ({error}); install it with "
                          f"pip install --no-deps --target {folder} -r {PADDLEFORMERS_REQUIREMENTS}") from error
    if paddleformers.__version__ != VERSION:
        warnings.warn(f"PaddleFormers {paddleformers.__version__} found, the demo was measured with {VERSION}", stacklevel=2)
    return modeling


def llama_config(hidden: int, ffn: int, heads: int = 4) -> Any:
    """A one-layer LLaMA config: no MLP bias, silu, unfused SwiGLU (PaddleFormers' defaults), TP=1, and the
    unfused RMSNorm (its fused kernel is not registered on CPU)."""
    from paddleformers.transformers.llama.configuration import LlamaConfig

    return LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                       num_key_value_heads=heads, num_hidden_layers=1, vocab_size=32, hidden_act="silu",
                       mlp_bias=False, fuse_swiglu=False, fuse_rms_norm=False, tensor_model_parallel_size=1)


def build_paddleformers_mlp(hidden: int, ffn: int) -> Any:
    """The released MLP (gate_proj, up_proj, down_proj: paddle.nn.Linear [in, out], no bias; act_fn: Silu)."""
    import paddle

    modeling = import_llama()
    paddle.set_device("cpu")
    return modeling.MLP(llama_config(hidden, ffn))


def capture_megatron(path: Path, eager: bool = False, seq: int = 16, batch: int = 2, hidden: int | None = None,
                     ffn: int | None = None) -> Path:
    """One step of the megatron-core MLP, no biases, fp32, captured at `path` (every module, full tensors)."""
    import megatron_mlp as M
    import torch

    from harness.capture import capture

    hidden, ffn = hidden or M.HIDDEN, ffn or M.FFN
    with M.megatron_group("cpu"):
        model = M.build_megatron_mlp(hidden, ffn, dtype=torch.float32, bias=False)
        inputs = M.demo_inputs(seq, batch, hidden, dtype=torch.float32)
        kind = "eager" if eager else "compiled"
        with capture(model, path, side=f"megatron-fp32-{kind}",
                     provenance=f"examples/mlp_alignment megatron-core MLP, no bias, fp32, {kind} SwiGLU, cpu") as cap:
            M.megatron_step(model, inputs, eager=eager)
            cap.step()
    return path


def capture_paddleformers(path: Path, tree_a: Path, tensor_map: Any) -> Any:
    """One step of PaddleFormers' MLP with A's weights, input and output gradient (through the map: [b, s, h]),
    captured at `path`. Returns the model."""
    import paddle_mlp
    import run_demo

    from harness.capture import capture

    weights = run_demo.paddle_weights_from(tree_a, tensor_map)
    hidden, ffn = weights["gate_proj.weight"].shape
    model = build_paddleformers_mlp(hidden, ffn)
    paddle_mlp.load_parameters(model, weights)
    step = run_demo.step_inputs_from(tree_a)  # A's [s, b, h]; the map makes them B's [b, s, h]
    names = {"x": call_tensor(ROOT, 0, "input", 0), "grad_out": call_tensor(ROOT, 0, "grad_output", 0)}
    mapped = tensor_map.to_b({names[key]: array for key, array in step.items()})
    with capture(model, path, side="paddleformers",
                 provenance=f"PaddleFormers {VERSION} paddleformers.nn.mlp.MLP (LLaMA), fp32, cpu") as cap:
        paddle_mlp.paddle_step(model, {key: mapped[name] for key, name in names.items()})
        cap.step()
    return model


def capture_decoder_layer(path: Path, hidden: int = 64, ffn: int = 128, heads: int = 4, seq: int = 16,
                          batch: int = 2, seed: int = 0) -> Path:
    """One step of PaddleFormers' LlamaDecoderLayer (RMSNorm, attention with RoPE and a causal mask, MLP),
    fp32 on CPU, its parameters from paddle.seed(seed), captured at `path`."""
    import paddle
    from paddleformers.transformers.masking_utils import create_causal_mask_and_row_indices

    from harness.capture import capture

    modeling = import_llama()
    paddle.set_device("cpu")
    paddle.seed(seed)
    config = llama_config(hidden, ffn, heads)
    layer, rope = modeling.LlamaDecoderLayer(config, layer_idx=0), modeling.LlamaRotaryEmbedding(config)
    x = paddle.randn([batch, seq, hidden])
    x.stop_gradient = False
    positions = paddle.arange(0, seq, dtype="int64").unsqueeze(0).tile((batch, 1))
    mask, _ = create_causal_mask_and_row_indices(  # as LlamaModel.forward makes it for eager attention
        config=config, inputs_embeds=x, batch_size=batch, seq_length=seq, cache_length=0,
        prepare_decoder_attention_mask=modeling.LlamaModel._prepare_decoder_attention_mask)
    with capture(layer, path, side="paddleformers",
                 provenance=f"PaddleFormers {VERSION} LlamaDecoderLayer, fp32, eager attention, cpu") as cap:
        out = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rope(x, positions))
        out.backward(paddle.randn(out.shape) * 0.1)
        cap.step()
    return path


def swiglu_on_a_input(model_b: Any, tree_a: Path, tensor_map: Any) -> tuple[int, int]:
    """PaddleFormers' activation (act_fn(gate) * up, as MLP.forward computes it) on A's captured linear_fc1
    output: (elements that differ from A's linear_fc2 input, elements). Megatron's SwiGLU is no module, so
    replay cannot isolate it; this does."""
    import paddle
    import run_demo

    arrays = run_demo.a_arrays(tree_a)
    parts = tensor_map.to_b({"mlp.linear_fc1#0:output.0": arrays["mlp.linear_fc1#0:output.0"]})
    gate, up = (paddle.to_tensor(parts[f"{name}#0:output.0"]) for name in ("gate_proj", "up_proj"))
    made = (model_b.act_fn(gate) * up).numpy().transpose(1, 0, 2)  # [b, s, ffn] -> A's [s, b, ffn]
    expected = arrays["mlp.linear_fc2#0:input.0"]
    return int(np.count_nonzero(made.view(np.uint32) != expected.view(np.uint32))), expected.size


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="folder for the trees (default: a temporary one)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="xfalign-paddleformers-"))
    import_llama()  # fail early, with the install line
    import run_demo

    from harness.capture.mapping import load_map
    from harness.capture.replay import replay
    from harness.compare.tree import compare_trees
    from harness.store.tree import read_tree
    from harness.store.tree_format import CaptureInfo

    tensor_map = load_map(MAP)
    trees_a = {kind: capture_megatron(out / f"megatron-fp32-{kind}", eager=kind == "eager") for kind in ("compiled", "eager")}
    megatron_self = compare_trees(trees_a["compiled"], trees_a["eager"]).divergence
    print("megatron fp32 compiled vs eager: " + ("bitwise equal" if megatron_self is None else
          f"first divergence {megatron_self.name}"))
    tree_b = out / "paddleformers-mlp"
    model_b = capture_paddleformers(tree_b, trees_a["compiled"], tensor_map)
    for kind, tree_a in trees_a.items():
        comparison = compare_trees(tree_a, tree_b, tensor_map)
        first = comparison.divergence
        print(f"megatron fp32 {kind} vs paddleformers MLP: " + ("bitwise equal" if first is None else
              f"first divergence {first.name} ({first.phase} of {first.module}, {first.module_type})"))
        for name, counts in run_demo.summary(comparison, tensor_map).items():
            text = "missing or not comparable" if counts is None else "{} of {} differ, max {} ULP".format(*counts)
            print(f"    {name}: {text}")
        for module_a in ("mlp.linear_fc1", "mlp.linear_fc2", ROOT):
            result = replay(run_demo.modules_of(model_b, module_a, tensor_map), tree_a, module_a, tensor_map)
            print(f"    replay of {module_a} on {', '.join(result.modules_b)}: {result.verdict}" +
                  run_demo._difference(result))
        print("    act_fn(gate) * up on A's linear_fc1 output: {} of {} differ from A's SwiGLU".format(
            *swiglu_on_a_input(model_b, tree_a, tensor_map)))
    decoder = capture_decoder_layer(out / "paddleformers-decoder-layer")
    info = CaptureInfo.model_validate(read_tree(decoder).step(0).meta["capture"])
    print(f"paddleformers LlamaDecoderLayer: {len(info.modules)} modules, {len(info.records)} records")
    for record in info.records:
        print(f"    {record.phase:8} {record.module}#{record.call}: {', '.join(record.tensors)}")
    print(f"trees in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
