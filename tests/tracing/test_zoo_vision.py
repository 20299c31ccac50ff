"""The zoo's re-implementations of torchvision's ResNet-50 and DenseNet-121
(planner.zoo.vision_models): parameter counts and module names as torchvision's, a training step,
and (slow) the traced graph's store-all peak against a measured CPU step."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import planner.zoo as zoo  # noqa: E402
from planner.zoo.vision_models import densenet121, resnet50  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: intra-op threads only contend on a busy machine
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_match_torchvision() -> None:
    assert _count(resnet50(num_classes=1000)) == 25_557_032
    assert _count(densenet121(num_classes=1000)) == 7_978_856


def test_module_names_match_torchvision() -> None:
    r = dict(resnet50(num_classes=1000, width=8).named_modules())
    for name in ("conv1", "bn1", "relu", "maxpool", "layer1.0.conv1", "layer1.0.bn3",
                 "layer1.0.downsample.0", "layer1.0.downsample.1", "layer2.0.conv2",
                 "layer4.2.conv3", "avgpool", "fc"):
        assert name in r, name
    assert "layer1.1.downsample" not in r or r["layer1.1.downsample"] is None
    assert r["layer2.0.conv2"].stride == (2, 2) and r["layer2.0.conv1"].stride == (1, 1)
    assert len(r["layer3"]) == 6 and r["fc"].in_features == 8 * 8 * 4
    d = dict(densenet121().named_modules())
    for name in ("features.conv0", "features.norm0", "features.relu0", "features.pool0",
                 "features.denseblock1.denselayer1.norm1", "features.denseblock1.denselayer6.conv2",
                 "features.denseblock4.denselayer16.conv2", "features.transition3.pool",
                 "features.norm5", "classifier"):
        assert name in d, name
    assert d["classifier"].in_features == 1024


def test_the_factories_are_not_shadowed_by_the_model_module() -> None:
    # planner.zoo.vision_models is imported above; the package's names stay the factories
    assert callable(zoo.resnet50) and callable(zoo.densenet121)
    assert {"resnet50", "densenet121"} <= set(zoo.ZOO)
    assert "resnet50" not in zoo.TINY and "densenet121" not in zoo.TINY


# Batch 2: at 32×32 the last stage is 1×1, and training BatchNorm needs more than one value.
@pytest.mark.parametrize("name,kwargs", [
    ("resnet50", dict(width=16)),
    ("densenet121", {}),
])
def test_training_step_gives_finite_loss_and_every_gradient(
    name: str, kwargs: dict[str, Any]
) -> None:
    model, (x, y) = getattr(zoo, name)(batch_size=2, image=32, **kwargs)
    assert x.shape == (2, 3, 32, 32) and y.shape == (2,)
    assert model(x).shape == (2, 10)  # logits without a target
    loss = model(x, y)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.slow
@pytest.mark.parametrize("name,kwargs", [
    ("resnet50", dict(width=16, image=32)),
    ("densenet121", dict(image=32)),
])
def test_traced_store_all_peak_matches_a_measured_step(
    name: str, kwargs: dict[str, Any]
) -> None:
    from planner.tracing import trace
    from planner.tracing.fidelity import check_fidelity

    model, inputs = getattr(zoo, name)(**kwargs)
    graph = trace(model, inputs).graph
    f = check_fidelity(name, model, inputs, graph, time_it=False)
    assert f.memory_ratio == pytest.approx(1.0, abs=0.02), f
