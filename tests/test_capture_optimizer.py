"""capture(..., optimizer=): the optimizer step recorded on torch (AdamW), Paddle (AdamW with its global-norm
clip) and megatron-core (its FP32 optimizer, where CUDA is available): names, record order, the states and
updated parameters bit for bit against the optimizer's own tensors, learning rates, grad norms, and the
optimizer left as it was."""

import numpy as np
import pytest

from harness.capture import capture
from harness.capture.api import CaptureError
from harness.store.dump import Dump
from harness.store.tree import read_tree

pytestmark = pytest.mark.xdist_group("in_process_frameworks")

STEPS = 3


def phases(dump):
    return [(r["module"], r["phase"]) for r in dump.meta["capture"]["records"]]


def check_order(dump):
    """loss before the backward pass; the optimizer's records last, (train) before the modules'."""
    order = [phase for _, phase in phases(dump)]
    assert order.index("loss") < order.index("backward")
    first = order.index("optimizer")
    assert first > max(i for i, phase in enumerate(order) if phase == "grads")
    assert phases(dump)[first] == ("(train)", "optimizer") and set(order[first:]) == {"optimizer"}


def torch_training(torch, tree, clip=None, call_step=False, mode="full"):
    """Linear -> ReLU -> Linear trained STEPS steps with AdamW; per step: the loss, the state and the
    parameters as the optimizer left them (copies)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    seen = []
    with capture(model, tree, mode=mode, optimizer=opt) as cap:
        for _ in range(STEPS):
            loss = model(torch.randn(4, 6)).square().mean()
            loss.backward()
            cap.loss(loss)
            if call_step:
                cap.step()
            if clip is not None:
                cap.grad_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
            opt.step()
            seen.append({"loss": loss.item(), "lr": opt.param_groups[0]["lr"],
                         "state": {name: {k: v.clone().numpy() for k, v in opt.state[param].items()}
                                   for name, param in model.named_parameters()},
                         "params": {name: param.detach().clone().numpy() for name, param in model.named_parameters()}})
            opt.zero_grad()
    return model, opt, seen


def test_torch_adamw_step_records_states_updated_parameters_and_scalars(torch, tmp_path):
    model, opt, seen = torch_training(torch, tmp_path / "tree")
    tree = read_tree(tmp_path / "tree")
    assert tree.manifest.optimizer == "AdamW" and len(tree.steps) == STEPS
    for index, expected in enumerate(seen):
        dump = Dump.read(tree.step_path(index))
        check_order(dump)
        t = dump.tensors
        assert t["(train):loss.0"].shape == () and float(t["(train):loss.0"]) == expected["loss"]
        assert float(t["(train):lr.0"]) == expected["lr"]
        for name, state in expected["state"].items():
            module, _, param = name.partition(".")
            for role in ("exp_avg", "exp_avg_sq", "step"):
                np.testing.assert_array_equal(t[f"{module}:{role}.{param}"], state[role])
            np.testing.assert_array_equal(t[f"{module}:updated.{param}"], expected["params"][name])
            if index + 1 < STEPS:  # the next step starts from the updated parameters
                np.testing.assert_array_equal(Dump.read(tree.step_path(index + 1)).tensors[f"{module}:param.{param}"],
                                              expected["params"][name])
        grads = [t[f"{m}:grad.{p}"] for m in ("0", "2") for p in ("weight", "bias")]
        norm = np.sqrt(sum(np.square(np.linalg.norm(g.astype(np.float64))) for g in grads))
        assert float(t["(train):grad_norm.pre_clip"]) == pytest.approx(norm, rel=1e-12)
    # the optimizer and the model are left as they were: a step after the capture records nothing
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_step_before_the_clip_records_the_unclipped_gradients(torch, tmp_path):
    torch_training(torch, tmp_path / "tree", clip=1e-3, call_step=True)
    tree = read_tree(tmp_path / "tree")
    for path in map(tree.step_path, range(len(tree.steps))):
        t = Dump.read(path).tensors
        assert float(t["(train):grad_norm.pre_clip"]) > 1e-3  # the gradients before clipping
        assert float(t["(train):grad_norm.post_clip"]) == pytest.approx(1e-3, rel=1e-5)  # those the step applied
        assert float(t["(train):grad_norm.reported"]) == pytest.approx(float(t["(train):grad_norm.pre_clip"]), rel=1e-5)
        assert not np.array_equal(t["0:grad.weight"], t["0:grad_clipped.weight"])


def test_digest_mode_keeps_the_scalars_in_full_and_digests_of_the_rest(torch, tmp_path):
    torch_training(torch, tmp_path / "full", mode="full")
    torch_training(torch, tmp_path / "digest", mode="digest")
    full, digest = Dump.read(tmp_path / "full" / "step-00001"), Dump.read(tmp_path / "digest" / "step-00001")
    assert set(digest.tensors) == {name for name in full.tensors if name.startswith("(train)")}
    for name in full.tensors:
        if not name.startswith("(train)"):
            assert digest.digests[name].md5 == full.digests[name].md5, name


def test_paddle_adamw_with_global_norm_clip(paddle, tmp_path):
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(6, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 3))
    clip = paddle.nn.ClipGradByGlobalNorm(1e-3)
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), grad_clip=clip)
    step_method, clip_method = opt.step, clip._dygraph_clip
    seen = []
    with capture(model, tmp_path / "tree", mode="full", optimizer=opt) as cap:
        for _ in range(STEPS):
            loss = model(paddle.randn([4, 6])).square().mean()
            loss.backward()
            cap.loss(loss)
            opt.step()
            seen.append({name: {acc: per[param.name].numpy().copy() for acc, per in opt._accumulators.items()}
                         | {"updated": param.numpy().copy()} for name, param in model.named_parameters()})
            opt.clear_grad()
    assert "step" not in vars(opt) and "_dygraph_clip" not in vars(clip)  # put back
    assert opt.step == step_method and clip._dygraph_clip == clip_method
    tree = read_tree(tmp_path / "tree")
    assert tree.manifest.optimizer == "AdamW"
    for index, expected in enumerate(seen):
        dump = Dump.read(tree.step_path(index))
        check_order(dump)
        t = dump.tensors
        for name, tensors in expected.items():
            module, _, param = name.partition(".")
            assert set(tensors) == {"moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc", "updated"}
            for role, array in tensors.items():
                np.testing.assert_array_equal(t[f"{module}:{role}.{param}"], array)
        assert float(t["(train):grad_norm.post_clip"]) == pytest.approx(1e-3, rel=1e-5)  # the clip's output
        assert float(t["(train):grad_norm.pre_clip"]) > 1e-3  # param.grad: not clipped in place
        assert "(train):grad_norm.reported" not in t  # Paddle's clip does not return its norm


def test_an_optimizer_of_another_framework_is_refused(torch, paddle, tmp_path):
    model = torch.nn.Linear(2, 2)
    other = paddle.optimizer.SGD(parameters=paddle.nn.Linear(2, 2).parameters())
    with pytest.raises(CaptureError, match="not an optimizer of megatron"):
        capture(model, tmp_path / "tree", optimizer=other)
    with pytest.raises(CaptureError, match="outside the `with capture"):
        capture(model, tmp_path / "tree").loss(1.0)


def test_megatron_fp32_optimizer_on_cuda(torch, tmp_path):
    """megatron-core's optimizer wrappers allocate on CUDA: this runs where a GPU is."""
    if not torch.cuda.is_available():
        pytest.skip("megatron-core's FP32Optimizer needs CUDA (its __init__ allocates CUDA tensors)")
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import FP32Optimizer

    from harness.frameworks.megatron_group import one_process_group

    with one_process_group("cuda"):
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).cuda()
        config = OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1e-3, bf16=False)
        opt = FP32Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), config, init_state_fn=None)
        with capture(model, tmp_path / "tree", mode="full", optimizer=opt) as cap:
            for _ in range(2):
                loss = model(torch.randn(4, 6, device="cuda")).square().mean()
                loss.backward()
                cap.loss(loss)
                _, norm, _ = opt.step()
                opt.zero_grad()
        t = Dump.read(read_tree(tmp_path / "tree").step_path(1)).tensors
        assert float(t["(train):grad_norm.reported"]) == pytest.approx(norm, rel=1e-6)
        assert float(t["(train):grad_norm.post_clip"]) == pytest.approx(1e-3, rel=1e-4)
        np.testing.assert_array_equal(t["0:updated.weight"], model[0].weight.detach().cpu().numpy())
        assert "step" not in vars(opt)


def test_megatron_float16_optimizer_records_main_params_and_their_states_on_cuda(torch, tmp_path):
    """bf16 parameters, fp32 main parameters: the states are the main parameters', the update is copied back."""
    if not torch.cuda.is_available():
        pytest.skip("megatron-core's Float16OptimizerWithFloat16Params needs CUDA")
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    from harness.frameworks.megatron_group import one_process_group

    with one_process_group("cuda"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).cuda().bfloat16()
        config = OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1.0, bf16=True)
        opt = Float16OptimizerWithFloat16Params(torch.optim.AdamW(model.parameters(), lr=1e-2), config,
                                                grad_scaler=None, init_state_fn=None)
        weight = model[0].weight
        with capture(model, tmp_path / "tree", mode="full", optimizer=opt) as cap:
            for _ in range(2):
                loss = model(torch.randn(4, 6, device="cuda", dtype=torch.bfloat16)).float().square().mean()
                loss.backward()
                for param in model.parameters():  # what megatron-core's DDP buffer provides
                    param.main_grad = param.grad
                cap.loss(loss)
                _, norm, _ = opt.step()
                applied = weight.main_param.grad.cpu().numpy()  # zero_grad drops it
                opt.zero_grad()
        t = Dump.read(read_tree(tmp_path / "tree").step_path(1)).tensors
        assert t["0:main_param.weight"].dtype == np.float32 and t["0:updated.weight"].dtype.itemsize == 2
        np.testing.assert_array_equal(t["0:main_param.weight"], weight.main_param.detach().cpu().numpy())
        state = opt.optimizer.state[weight.main_param]
        np.testing.assert_array_equal(t["0:exp_avg.weight"], state["exp_avg"].cpu().numpy())
        np.testing.assert_array_equal(t["0:grad_clipped.weight"], applied)
        assert np.array_equal(t["0:updated.weight"].view(np.uint16),
                              weight.detach().cpu().view(torch.int16).numpy().view(np.uint16))
        assert float(t["(train):grad_norm.reported"]) == pytest.approx(norm, rel=1e-6)
