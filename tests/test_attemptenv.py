"""An attempt's environment from its slot's kept part (exec/attemptenv.py) is the long way's:
the same variables in the same order, the same ``own_env``, whatever the environments hold."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuswarm.exec import attemptenv
from gpuswarm.exec.attemptenv import PER_TASK, EnvOf, Identity, attempt_env, env_long
from gpuswarm.placement.devices import Gpu, Vendor
from gpuswarm.placement.gpus import Slot

_NAMES = st.sampled_from(
    ["HOME", "PATH", "PWD", "A-B", "LANG", "CUDA_VISIBLE_DEVICES", "GPUSWARM_TASK_ID",
     "GPUSWARM_OWNER", "GPUSWARM_ATTEMPT", "été", "X"]
)  # fmt: skip
_VALUES = st.sampled_from(["", "1", "/tmp", "/", "0,1", "t1", "me", "a b"])
_ENVS = st.dictionaries(_NAMES, _VALUES, max_size=8)
_SLOTS = st.sampled_from(
    [
        Slot(0, (0,), Vendor.SIM),
        Slot(1, (2, 3), Vendor.NVIDIA, ident="h-gpu2+3"),
        Slot(2, (5,), Vendor.AMD, share=1),
        Slot(3, (1,), Vendor.NVIDIA, devices=(Gpu(1, "A100", Vendor.NVIDIA, uuid="MIG-x"),)),
    ]
)
_IDENTS = st.builds(
    Identity,
    run_dir=st.sampled_from(["/r/run_1", "/r/run_2"]),
    task_id=st.sampled_from(["t1", "t2", "000007"]),
    name=st.sampled_from(["t1", "a b", "1"]),
    workspace=st.sampled_from(["/r/run_1/tasks/t1", "/tmp"]),
    attempt=st.sampled_from(["1", "2"]),
    owner=st.sampled_from(["me", "h-1"]),
    task_dir=st.none() | st.just("/d"),
)


@settings(max_examples=300, deadline=None)
@given(
    bases=st.lists(_ENVS, min_size=1, max_size=3),
    inherited=_ENVS,
    task_env=st.dictionaries(_NAMES, _VALUES, max_size=2),
    slot=_SLOTS,
    ident=_IDENTS,
    direct=st.booleans(),
    data=st.data(),
)
def test_the_kept_part_gives_the_long_ways_environment(
    bases: list[dict[str, str]],
    inherited: dict[str, str],
    task_env: dict[str, str],
    slot: Slot,
    ident: Identity,
    direct: bool,
    data: st.DataObject,
) -> None:
    attemptenv._parts.clear()
    cwd = str(Path(__file__).parent) if direct else None
    for base in bases:  # a part made for one environment is never used for another
        for _ in range(2):  # made, then kept
            gpu_ids = data.draw(st.sampled_from([slot.gpu_ids, slot.gpu_ids[:1]]))
            of = EnvOf(base, task_env, slot, gpu_ids, ident, cwd, inherited)
            env, own = attempt_env(of)
            long_env, long_own = env_long(of)
            assert list(env.items()) == list(long_env.items())
            assert own == long_own


def test_a_changed_slot_environment_is_seen() -> None:
    attemptenv._parts.clear()
    slot = Slot(0, (0,), Vendor.SIM)
    ident = Identity("/r", "t1", "t1", "/r/tasks/t1", "1", "me", None)
    base = {"HOME": "/h", "PATH": "/bin"}
    first, _ = attempt_env(EnvOf(base, {}, slot, (0,), ident, None, {}))
    base["HOME"] = "/elsewhere"  # the same dict, changed in place
    second, own = attempt_env(EnvOf(base, {}, slot, (0,), ident, None, {"PATH": "/bin"}))
    assert (first["HOME"], second["HOME"]) == ("/h", "/elsewhere")
    assert "PATH" not in own and "HOME" in own and set(PER_TASK) <= own
