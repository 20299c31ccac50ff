"""planner.tracing.cuda_allocator: which allocator configurations split blocks exactly, and the
one warning when the user's configuration lets the measured peak exceed the plan's. (The setting
itself is exercised on CUDA by the gpu-marked runtime tests: their peaks are exact under it.)"""

from __future__ import annotations

import warnings

import pytest

from planner.tracing import cuda_allocator
from planner.tracing.cuda_allocator import AllocatorWarning, splits_exactly, use_exact_allocator


@pytest.mark.parametrize(("conf", "exact"), [
    (None, False), ("", False), ("expandable_segments:True", True),
    ("max_split_size_mb:128, expandable_segments:True", True),
    ("expandable_segments:False", False), ("max_split_size_mb:128", False),
])
def test_configurations_that_split_exactly(conf: str | None, exact: bool) -> None:
    assert splits_exactly(conf) is exact


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(cuda_allocator, "_state", {"done": False})
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_user_configuration_without_expandable_segments_warns_once(
        fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    with pytest.warns(AllocatorWarning, match="expandable_segments:True"):
        assert use_exact_allocator() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert use_exact_allocator() is False  # once per process


def test_the_users_exact_configuration_is_kept(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    called = []
    torch = pytest.importorskip("torch")
    fresh.setattr(torch.cuda.memory, "_set_allocator_settings", called.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert use_exact_allocator() is True
    assert called == []


def test_without_a_configuration_expandable_segments_are_turned_on(
        fresh: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    called: list[str] = []
    fresh.setattr(torch.cuda.memory, "_set_allocator_settings", called.append)
    assert use_exact_allocator() is True and use_exact_allocator() is True
    assert called == ["expandable_segments:True"]
