"""resources.json: presets, validation with one-line errors, JSON round trip, JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.core.errors import InputError
from planner.core.resources import (
    GB,
    LINK_PRESETS,
    PRESETS,
    GiB,
    Link,
    Resources,
    load_resources,
    preset_names,
    resources_from_dict,
    resources_preset,
)


def test_device_presets_have_published_memory() -> None:
    assert PRESETS["h100-sxm"].device_memory_bytes == 80 * GiB
    assert PRESETS["h100-pcie"].device_memory_bytes == 80 * GiB
    assert PRESETS["h200"].device_memory_bytes == 141 * GB
    assert PRESETS["a100-40g"].device_memory_bytes == 40 * GiB
    assert PRESETS["a100-80g"].device_memory_bytes == 80 * GiB
    for name, res in PRESETS.items():
        assert res.device_name == name and res.device_count == 1
        assert res.h2d is not None and res.d2h == res.h2d and res.device_link is not None
        assert not res.has_host_tier  # host memory is the server's: the user says how much


def test_link_presets_are_per_direction_effective_rates() -> None:
    assert LINK_PRESETS["pcie-gen4-x16"].bandwidth_bytes_per_s == 25e9
    assert LINK_PRESETS["pcie-gen5-x16"].bandwidth_bytes_per_s == 50e9
    assert LINK_PRESETS["nvlink4"].bandwidth_bytes_per_s == 450e9
    assert LINK_PRESETS["nvlink-c2c"].bandwidth_bytes_per_s == 450e9
    assert LINK_PRESETS["pcie-gen4-x16"].latency_s == 10e-6


def test_natural_links_and_combined_names() -> None:
    sxm = resources_preset("h100-sxm")
    assert sxm.h2d == LINK_PRESETS["pcie-gen5-x16"]
    assert sxm.device_link == LINK_PRESETS["nvlink4"]
    pcie = resources_preset("h100-pcie-gen5")
    assert pcie.device_link == pcie.h2d == LINK_PRESETS["pcie-gen5-x16"]  # d2d over PCIe
    assert pcie.device_name == "h100-pcie-gen5"
    old_host = resources_preset("h100-pcie-gen4")
    assert old_host.h2d == old_host.device_link == LINK_PRESETS["pcie-gen4-x16"]
    a100 = resources_preset("a100-80g-gen4")
    assert a100.device_memory_bytes == 80 * GiB and a100.h2d == LINK_PRESETS["pcie-gen4-x16"]
    assert a100.device_link == LINK_PRESETS["nvlink3"]  # an SXM board keeps NVLink between GPUs
    assert resources_preset("gh200").h2d == LINK_PRESETS["nvlink-c2c"]
    assert resources_preset("h100-sxm-pcie-gen4-x16").h2d == LINK_PRESETS["pcie-gen4-x16"]
    assert resources_preset("H100-SXM-80G") == sxm
    for name in preset_names():
        assert resources_preset(name).device_memory_bytes


def test_unknown_preset_lists_valid_names() -> None:
    with pytest.raises(InputError) as err:
        resources_preset("h100")
    msg = str(err.value)
    assert "\n" not in msg and "h100-sxm" in msg and "a100-80g" in msg and "gen5" in msg


def test_transfer_time() -> None:
    link = Link(bandwidth_bytes_per_s=50e9, latency_s=10e-6)
    assert link.transfer_ms(50 * 10**6) == pytest.approx(1.0 + 0.01)
    assert link.transfer_ms(0) == pytest.approx(0.01)
    assert str(link) == "50 GB/s + 10 us"


@pytest.mark.parametrize(
    ("doc", "fragments"),
    [
        ({"h2d": {"bandwidth_bytes_per_s": 0}}, ("h2d.bandwidth_bytes_per_s", "greater than 0")),
        ({"d2h": {"bandwidth_bytes_per_s": -5.0}}, ("d2h.bandwidth_bytes_per_s",)),
        (
            {"device_link": {"bandwidth_bytes_per_s": 1e9, "latency_s": -1}},
            ("device_link.latency_s", "greater than or equal to 0"),
        ),
        ({"device_count": 0}, ("device_count", "greater than or equal to 1")),
        ({"microbatches": 0}, ("microbatches",)),
        ({"device_memory_bytes": 0}, ("device_memory_bytes",)),
        ({"host_memory_bytes": -1}, ("host_memory_bytes",)),
        ({"pipeline_schedule": "dualpipe"}, ("pipeline_schedule", "1f1b")),
        ({"schema_version": "2"}, ("schema_version",)),
        ({"gpus": 8}, ("gpus", "Extra inputs")),
        ({"host_memory_bytes": 2**30}, ("host_memory_bytes", "h2d and d2h")),
        ({"h2d": "pcie-gen9"}, ("h2d", "unknown link preset", "pcie-gen5-x16")),
        ({"preset": "tpu-v5"}, ("tpu-v5", "h100-sxm")),
        ({"preset": 3}, ("preset",)),
    ],
)
def test_bad_documents_give_one_line_naming_the_field(
    doc: dict[str, object], fragments: tuple[str, ...]
) -> None:
    with pytest.raises(InputError) as err:
        resources_from_dict(doc, where="r.json")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("r.json: ")
    for f in fragments:
        assert f in msg, msg


def test_not_an_object() -> None:
    with pytest.raises(InputError, match="expected a JSON object"):
        resources_from_dict([1, 2], where="r.json")


def test_a_device_is_required_only_where_needed() -> None:
    bare = Resources()  # valid: the budget may come from elsewhere
    assert bare.device_memory_bytes is None and not bare.has_host_tier
    with pytest.raises(InputError) as err:
        bare.require_device_memory_bytes("r.json")
    assert "r.json: no device memory" in str(err.value) and "h100-sxm" in str(err.value)
    budget = Resources.for_budget(12345)
    assert budget.require_device_memory_bytes() == 12345
    assert budget.device_count == 1 and not budget.has_host_tier and budget.h2d is None


def test_preset_with_overrides_and_link_names() -> None:
    doc = {"preset": "h100-pcie-gen5", "host_memory_bytes": 256 * GiB, "device_count": 2}
    res = resources_from_dict(doc)
    assert res.device_memory_bytes == 80 * GiB and res.host_memory_bytes == 256 * GiB
    assert res.has_host_tier and res.device_count == 2
    assert res.h2d == LINK_PRESETS["pcie-gen5-x16"]
    mixed = resources_from_dict({"preset": "h100-sxm", "device_memory_bytes": 10**9})
    assert mixed.device_memory_bytes == 10**9 and mixed.device_link == LINK_PRESETS["nvlink4"]
    named = resources_from_dict({"h2d": "gen4", "host_memory_bytes": 10})
    assert named.h2d == named.d2h == LINK_PRESETS["pcie-gen4-x16"]  # one direction mirrors
    one_way = resources_from_dict(
        {"d2h": {"bandwidth_bytes_per_s": 1e9}, "h2d": {"bandwidth_bytes_per_s": 2e9}}
    )
    assert one_way.d2h.bandwidth_bytes_per_s == 1e9  # type: ignore[union-attr]
    assert resources_from_dict("a100-40g") == PRESETS["a100-40g"]


def test_json_round_trip(tmp_path: Path) -> None:
    res = resources_from_dict(
        {
            "preset": "h100-sxm",
            "host_memory_bytes": 512 * GiB,
            "device_count": 4,
            "microbatches": 8,
            "pipeline_schedule": "1f1b",
        }
    )
    path = tmp_path / "resources.json"
    path.write_text(res.model_dump_json(indent=1))
    back = load_resources(path)
    assert back == res
    assert "preset" not in json.loads(path.read_text())  # dumped in the explicit form
    assert Resources.model_validate_json(res.model_dump_json()) == res


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_resources(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        load_resources(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"device_count": -1}))
    with pytest.raises(InputError, match=r"wrong.json: device_count"):
        load_resources(wrong)


def test_json_schema_is_documented() -> None:
    schema = Resources.model_json_schema()
    props = schema["properties"]
    for name in Resources.model_fields:
        if name != "schema_version":
            assert props[name].get("description"), name
    assert "preset" in props and "h100-sxm" in props["preset"]["description"]
    assert schema["additionalProperties"] is False
    link = schema["$defs"]["Link"]
    assert link["properties"]["bandwidth_bytes_per_s"]["exclusiveMinimum"] == 0
    assert {"type": "string", "enum": sorted(LINK_PRESETS)} in props["h2d"]["anyOf"]
    json.dumps(schema)


def test_text_form() -> None:
    text = str(resources_from_dict({"preset": "h100-pcie-gen5", "host_memory_bytes": 256 * GiB}))
    assert "h100-pcie-gen5" in text and "80.00 GiB" in text and "host 256.00 GiB" in text
    assert "50 GB/s" in text
    assert str(Resources()) == "1 x device (unbounded)"
