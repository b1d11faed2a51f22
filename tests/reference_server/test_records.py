"""The typed sandbox record: round trips, the JSON layout older servers wrote, strict reading, defaults."""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_server._credentials import SealedToken
from reference_server._records import (
    STATES,
    TRANSITIONS,
    Defaults,
    LifecycleEvent,
    MountedVolume,
    NetworkSettings,
    SandboxDetails,
    SandboxRecord,
    SandboxState,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

_text = st.text(max_size=8)
_sealed = st.builds(
    SealedToken,
    version=st.integers(1, 9),
    nonce=st.binary(min_size=12, max_size=12),
    ciphertext=st.binary(min_size=17, max_size=48),
    digest=st.binary(min_size=32, max_size=32),
)
_events = st.builds(
    LifecycleEvent,
    timestamp=st.just("2026-01-01T00:00:00.000000Z"),
    level=st.sampled_from(["info", "warn"]),
    message=_text,
    fields=st.dictionaries(_text, _text, max_size=2),
)
details_values = st.builds(
    SandboxDetails,
    envd_version=_text,
    secure=st.booleans(),
    envd_token=st.none() | _sealed,
    traffic_token=st.none() | _sealed,
    allow_internet_access=st.booleans(),
    network=st.builds(
        NetworkSettings,
        allow_public_traffic=st.booleans(),
        allow_out=st.lists(_text, max_size=2).map(tuple),
        deny_out=st.lists(_text, max_size=2).map(tuple),
        mask_request_host=st.none() | st.text(min_size=1, max_size=8),
    ),
    auto_pause_memory=st.booleans(),
    auto_resume=st.booleans(),
    cpu_count=st.integers(1, 64),
    memory_mb=st.integers(1, 1 << 20),
    disk_mb=st.integers(0, 1 << 20),
    timeout_s=st.integers(0, 86_400),
    address=st.none() | _text,
    started_at=st.none() | _text,
    paused_memory=st.none() | st.booleans(),
    events=st.lists(_events, max_size=3).map(tuple),
)


def _record(**overrides: object) -> SandboxRecord:
    values: dict[str, object] = {
        "sandbox_id": "sb-1",
        "owner": "team-a",
        "template_id": "base",
        "state": SandboxState.RUNNING,
        "created_at": T0,
        "expires_at": T0 + timedelta(minutes=5),
    }
    values.update(overrides)
    return SandboxRecord(**values)  # type: ignore[arg-type]


@given(details_values)
def test_details_round_trip_through_the_record_json(details: SandboxDetails) -> None:
    record = _record(details=details)
    assert SandboxRecord.from_json(record.to_json()) == record


# What the server wrote before the record was typed (a create, then a start): it must read back.
OLDER_RECORD = {
    "sandbox_id": "ab12",
    "owner": "default",
    "template_id": "base",
    "state": "running",
    "generation": 3,
    "created_at": "2026-11-30T10:00:00.000000Z",
    "expires_at": "2026-11-30T10:05:00.000000Z",
    "metadata": {"team": "x"},
    "env_vars": {"A": "1"},
    "auto_pause": False,
    "data": {
        "envd_version": "0.6.4",
        "secure": True,
        "envd_token": {
            "version": 1,
            "nonce": "AAAAAAAAAAAAAAAA",
            "ciphertext": "AAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "digest": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        },
        "traffic_token": None,
        "allow_internet_access": True,
        "network": {"allowPublicTraffic": True, "allowOut": [], "denyOut": ["10.0.0.0/8"]},
        "auto_pause_memory": True,
        "auto_resume": False,
        "cpu_count": 2,
        "memory_mb": 512,
        "timeout_s": 300,
        "address": "10.11.0.2",
        "started_at": "2026-11-30T10:00:00.250000Z",
        "events": [{"timestamp": "2026-11-30T10:00:00.000000Z", "level": "info", "message": "m", "fields": {}}],
    },
}


def test_a_record_written_before_the_types_reads_back_unchanged() -> None:
    record = SandboxRecord.from_json(json.dumps(OLDER_RECORD))
    assert record.state is SandboxState.RUNNING
    assert record.details.network.deny_out == ("10.0.0.0/8",)
    assert record.details.envd_token is not None
    assert record.details.address == "10.11.0.2"
    assert json.loads(record.to_json()) == OLDER_RECORD  # the same layout, key for key


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("data", "unknown"), 1),
        (("data", "cpu_count"), True),  # a boolean never passes as a count
        (("data", "cpu_count"), "2"),
        (("data", "network", "allowOut"), "10.0.0.0/8"),
        (("data", "network", "extra"), 1),
        (("data", "events"), {}),
        (("data", "address"), 7),
    ],
)
def test_a_wrong_detail_is_an_error_not_dropped(path: tuple[str, ...], value: object) -> None:
    document = json.loads(json.dumps(OLDER_RECORD))
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=path[-2] if path[-1] == "extra" else path[-1]):
        SandboxRecord.from_json(json.dumps(document))


def test_omitted_details_take_the_one_default() -> None:
    document = json.loads(json.dumps(OLDER_RECORD))
    document["data"] = {"envd_version": "0.6.4"}
    details = SandboxRecord.from_json(json.dumps(document)).details
    assert details.cpu_count == Defaults.CPU_COUNT
    assert details.memory_mb == Defaults.MEMORY_MB
    assert details.auto_pause_memory is Defaults.AUTO_PAUSE_MEMORY
    assert details.network == NetworkSettings()
    assert details.network.allow_public_traffic is Defaults.ALLOW_PUBLIC_TRAFFIC


def test_states_are_an_enum_shared_with_the_lifecycle_table() -> None:
    assert set(TRANSITIONS) == set(SandboxState) == STATES
    assert all(target in STATES for targets in TRANSITIONS.values() for target in targets)
    assert _record(state="paused").state is SandboxState.PAUSED  # a stored string becomes the member
    with pytest.raises(ValueError, match="unknown sandbox state"):
        _record(state="sleeping")


def test_every_detail_field_is_written() -> None:
    details = SandboxDetails(
        paused_memory=True,
        disk_mb=1024,
        default_user="u",
        default_workdir="/w",
        start_cmd="s",
        ready_cmd="r",
        volume_mounts=(MountedVolume("vol-1", "data", "/mnt/data"),),
    )
    written = details.to_dict()
    assert set(written) == {item.name for item in fields(SandboxDetails)}
    assert SandboxDetails.from_dict(written) == details
    # Without mounts the field is left out, as in records made before volumes, and reads back empty.
    plain = SandboxDetails(disk_mb=1024)
    assert "volume_mounts" not in plain.to_dict()
    assert SandboxDetails.from_dict(plain.to_dict()).volume_mounts == ()
