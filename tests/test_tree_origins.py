"""Which module made each difference of two capture trees (harness.compare.origins through compare_trees, and
the terminal report of `xfalign compare`): a small torch model captured twice, side B changing one thing inside
one module (another op in its forward, another summation in its backward, the parent's own code between its
submodules). The module that changed is the origin; what it hands on downstream is inherited."""

import pytest

from harness.capture import capture
from harness.cli import main
from harness.compare.tree import compare_trees
from harness.store.tree_format import ROOT, TensorName

pytestmark = pytest.mark.xdist_group("in_process_frameworks")


def model(torch, variant=None):
    """(root) Sequential: fc1 -> act -> block (lin1, tanh, lin2) -> fc2, from seed 0. `variant` changes one
    thing: "act" the activation's op (GELU tanh approximation), "weight-grad" fc2's weight gradient summed in
    another order, "grad-input" act's backward, "parent" block's own op between its submodules."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            h = self.lin1(x)
            h = 2 * torch.sigmoid(2 * h) - 1 if variant == "parent" else torch.tanh(h)
            return self.lin2(h)

    class ScaledBackward(torch.autograd.Function):
        """Identity forward; backward multiplies the gradient by 3 and divides by 3 (rounds differently)."""

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * 3 / 3

    class Act(torch.nn.GELU):
        def forward(self, x):
            y = torch.nn.functional.gelu(x, approximate="tanh" if variant == "act" else "none")
            return ScaledBackward.apply(y) if variant == "grad-input" else y

    class WeightGrad(torch.autograd.Function):
        """F.linear with the weight gradient summed over the batch one row at a time."""

        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return torch.nn.functional.linear(x, weight, bias)

        @staticmethod
        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            grad_weight = sum(torch.outer(grad[i], x[i]) for i in range(len(x)))
            return grad @ weight, grad_weight, grad.sum(0)

    class Linear(torch.nn.Linear):
        def forward(self, x):
            if variant == "weight-grad":
                return WeightGrad.apply(x, self.weight, self.bias)
            return super().forward(x)

    torch.manual_seed(0)
    net = torch.nn.Sequential()
    for name, module in (("fc1", torch.nn.Linear(8, 16)), ("act", Act()), ("block", Block()), ("fc2", Linear(16, 4))):
        net.add_module(name, module)
    return net


def run(torch, path, side, variant=None):
    net = model(torch, variant)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    with capture(net, path, mode="full", side=side) as cap:
        net(x).square().mean().backward()
        cap.step()
    return path


@pytest.fixture(scope="module")
def trees(torch, tmp_path_factory):
    root = tmp_path_factory.mktemp("origins")
    a = run(torch, root / "a", "torch-a")
    return {variant: (a, run(torch, root / variant, f"torch-{variant}", variant))
            for variant in ("act", "weight-grad", "grad-input", "parent")}


def origins(tree_pair):
    (step,) = compare_trees(*tree_pair).steps
    return step, {name for name, origin in step.origins.items() if origin.origin}


def test_another_op_in_one_module_makes_it_the_origin_and_downstream_differences_are_inherited(trees):
    step, found = origins(trees["act"])
    assert found == {"act#0:output.0"}
    assert step.origins["act#0:output.0"].module_type == "Act" and step.origins["act#0:output.0"].rule == "inputs"
    differing = {result.name for result in step.comparison.tensors if not result.pair.bitwise}
    assert differing == set(step.origins)  # every differing tensor is classed
    # downstream: block's and fc2's calls, the root's output (explained by its child), every gradient
    for name in ("block.lin1#0:input.0", "fc2#0:output.0", f"{ROOT}#0:output.0", "fc1:grad.weight"):
        assert name in differing and not step.origins[name].origin, name
    # upstream of act, its inputs and the parameters: equal
    assert {"fc1#0:output.0", "act#0:input.0", "fc2:param.weight"}.isdisjoint(differing)
    assert step.inherited == len(differing) - 1


def test_a_weight_gradient_summed_in_another_order_is_an_origin_in_the_backward_pass(trees):
    step, found = origins(trees["weight-grad"])
    differing = {result.name for result in step.comparison.tensors if not result.pair.bitwise}
    assert "fc2:grad.weight" in differing  # 32 rows summed one by one: another rounding than one GEMM
    assert found == {"fc2:grad.weight"} and step.origins["fc2:grad.weight"].rule == "backward"
    assert not any(TensorName.parse(name).role in ("output", "grad_output") for name in differing)


def test_a_gradient_made_differently_on_its_way_back_is_the_first_backward_difference(trees):
    step, found = origins(trees["grad-input"])
    differing = {result.name for result in step.comparison.tensors if not result.pair.bitwise}
    assert "fc1#0:grad_output.0" in differing  # act's backward feeds fc1's output gradient
    assert found == {"fc1#0:grad_output.0"} and step.origins["fc1#0:grad_output.0"].rule == "first"
    assert not step.origins["fc1:grad.weight"].origin  # fc1's backward got another gradient: inherited
    assert all(TensorName.parse(name).role in ("grad_output", "grad") for name in differing)


def test_a_parents_own_op_between_its_submodules_makes_the_parent_the_origin(trees):
    step, found = origins(trees["parent"])
    assert "block.lin2#0:input.0" in {r.name for r in step.comparison.tensors if not r.pair.bitwise}
    assert not step.origins["block.lin2#0:output.0"].origin  # its input differs: handed on
    assert "block#0:output.0" in found and step.origins["block#0:output.0"].module_type == "Block"
    assert not step.origins[f"{ROOT}#0:output.0"].origin  # explained by block


def test_compare_marks_origins_in_the_terminal(trees, capsys):
    a, b = trees["act"]
    assert main(["compare", str(a), str(b), ]) == 1
    out = capsys.readouterr().out
    assert "divergent, origin (Act)" in out  # the table's mark (its cell may wrap after "first")
    assert "1 origin in step-00000: act#0:output.0 (Act, forward): its inputs and parameters are bitwise equal" in out
    step, _ = origins(trees["act"])
    assert f"{step.inherited} differing tensors inherited" in out
