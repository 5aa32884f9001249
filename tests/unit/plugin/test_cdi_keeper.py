"""The CDI spec ``nri-gpu run`` keeps current (``[cdi] spec``): written, rewritten,
removed, refused, and never silently beside another spec of the same kind."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import discover
from nri_gpu.engine.model import Inventory
from nri_gpu.plugin.cli.__main__ import build_parser as parser
from nri_gpu.plugin.cli.__main__ import load_config, main
from nri_gpu.plugin.cli.cdi_conflicts import conflicts
from nri_gpu.plugin.cli.cdi_keeper import SpecKeeper, WatchedInventory, keeper_for
from nri_gpu.plugin.config import CdiConfig, ConfigError, from_toml
from testbed.gpunode import FIXTURE_DRIVER, SimNode, build_node
from testbed.plugins import NRI_GPU, NRI_GPU_HOOK

THEIRS_YAML = '---\ncdiVersion: 0.5.0\nkind: "nvidia.com/gpu"\ndevices:\n- name: "0"\n'


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return build_node(tmp_path / "node", gpus=1, driver_files=FIXTURE_DRIVER)


@pytest.fixture
def inventory(node: SimNode) -> Inventory:
    return discover(engine_of(node))


def engine_of(node: SimNode) -> EngineConfig:
    return EngineConfig().with_roots(
        driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root)
    )


def keeper(path: Path, *, hook: list[str] | None = None, dirs: tuple[str, ...] = (), **kw: object) -> SpecKeeper:
    def render(inv: Inventory) -> str:
        return json.dumps({"kind": "nvidia.com/gpu", "driver": inv.driver_version, "gpus": len(inv.gpus)}) + "\n"

    return SpecKeeper(str(path), render, lambda: list(hook or []), spec_dirs=dirs, **kw)  # type: ignore[arg-type]


def spec_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "cdi"
    folder.mkdir(mode=0o755)
    return folder


def test_written_at_start_unchanged_then_rewritten_on_change(tmp_path: Path, inventory: Inventory) -> None:
    path = spec_folder(tmp_path) / "nri-gpu.json"
    kept = keeper(path)
    assert kept.sync(inventory) == "written"
    assert json.loads(path.read_text())["driver"] == inventory.driver_version
    assert path.stat().st_mode & 0o777 == 0o644
    first = path.stat().st_ino
    assert kept.sync(inventory) == "unchanged"
    assert path.stat().st_ino == first
    upgraded = dataclasses.replace(inventory, driver_version="555.58.02")
    assert kept.sync(upgraded) == "written"
    assert json.loads(path.read_text())["driver"] == "555.58.02"
    assert path.stat().st_ino != first  # a new file renamed over the name: never half a spec
    assert [p.name for p in path.parent.iterdir()] == ["nri-gpu.json"]  # no temporary file left


def test_removed_when_the_driver_or_its_gpus_are_gone(
    tmp_path: Path, inventory: Inventory, caplog: pytest.LogCaptureFixture
) -> None:
    path = spec_folder(tmp_path) / "nri-gpu.json"
    kept = keeper(path)
    assert kept.sync(inventory) == "written"
    caplog.set_level(logging.INFO)
    assert kept.sync(dataclasses.replace(inventory, driver_version=None, gpus=())) == "removed"
    assert not path.exists()
    assert f"CDI spec {path} removed: no NVIDIA driver on this node" in caplog.text
    assert kept.sync(dataclasses.replace(inventory, gpus=())) == "absent"
    assert kept.sync(inventory) == "written"


def test_refuses_a_folder_others_can_write(
    tmp_path: Path, inventory: Inventory, caplog: pytest.LogCaptureFixture
) -> None:
    folder = spec_folder(tmp_path)
    folder.chmod(0o777)
    kept = keeper(folder / "nri-gpu.json")
    assert kept.sync(inventory) == "refused"
    assert not (folder / "nri-gpu.json").exists()
    assert "users other than root can change its folder" in caplog.text
    assert f"{folder} is writable by its group and others (mode 0777)" in caplog.text
    folder.chmod(0o755)
    assert kept.sync(inventory) == "written"


def test_refuses_a_hook_others_can_change_unless_allowed(tmp_path: Path, inventory: Inventory) -> None:
    path = spec_folder(tmp_path) / "nri-gpu.json"
    assert keeper(path, hook=["/x/nri-gpu-hook is owned by uid 1000, not root"]).sync(inventory) == "refused"
    assert not path.exists()
    allowed = keeper(path, hook=["/x/nri-gpu-hook is owned by uid 1000, not root"], allow_untrusted=True)
    assert allowed.sync(inventory) == "written"


def test_a_link_at_the_name_is_refused_never_followed(tmp_path: Path, inventory: Inventory) -> None:
    folder = spec_folder(tmp_path)
    target = tmp_path / "elsewhere.json"
    target.write_text("theirs\n")
    (folder / "nri-gpu.json").symlink_to(target)
    assert keeper(folder / "nri-gpu.json").sync(inventory) == "failed"
    assert target.read_text() == "theirs\n"
    assert (folder / "nri-gpu.json").is_symlink()


def test_a_missing_folder_is_made(tmp_path: Path, inventory: Inventory) -> None:
    path = tmp_path / "etc" / "cdi" / "nri-gpu.json"
    (tmp_path / "etc").mkdir(mode=0o755)
    assert keeper(path).sync(inventory) == "written"
    assert path.parent.stat().st_mode & 0o777 == 0o755


def test_steps_aside_for_a_spec_of_the_same_kind_in_its_folder(
    tmp_path: Path, inventory: Inventory, caplog: pytest.LogCaptureFixture
) -> None:
    folder = spec_folder(tmp_path)
    path = folder / "nri-gpu.json"
    kept = keeper(path)
    assert kept.sync(inventory) == "written"
    (folder / "nvidia.yaml").write_text(THEIRS_YAML)  # the toolkit's nvidia-cdi-refresh came later
    assert kept.sync(inventory) == "conflict"
    assert not path.exists()  # theirs works again; both would have been dropped
    assert f"{folder}/nvidia.yaml also defines CDI kind nvidia.com/gpu in {folder}" in caplog.text
    assert "the CDI cache drops every device both specs name" in caplog.text
    assert kept.sync(inventory) == "conflict"
    (folder / "nvidia.yaml").unlink()
    assert kept.sync(inventory) == "written"


def test_a_spec_in_the_other_standard_folder_is_named_and_ours_still_written(
    tmp_path: Path, inventory: Inventory, caplog: pytest.LogCaptureFixture
) -> None:
    etc, run = spec_folder(tmp_path), tmp_path / "run-cdi"
    run.mkdir()
    (run / "nvidia.yaml").write_text(THEIRS_YAML)
    kept = keeper(etc / "nri-gpu.json", dirs=(str(etc), str(run)))
    assert kept.sync(inventory) == "written"
    assert f"{run}/nvidia.yaml also defines CDI kind nvidia.com/gpu, and {run} beats {etc}" in caplog.text
    (etc / "other.json").write_text(json.dumps({"kind": "nvidia.com/gpu"}))
    ours_in_run = conflicts(str(run / "nri-gpu.json"), spec_dirs=(str(etc), str(run)))
    assert [(c.other, c.same_folder) for c in ours_in_run] == [
        (f"{run}/nvidia.yaml", True),
        (f"{etc}/nri-gpu.json", False),  # the one just kept there: a spec like any other
        (f"{etc}/other.json", False),
    ]
    assert f"{run} beats {etc}: {run}/nri-gpu.json shadows its devices" in ours_in_run[2].message


def test_conflicts_reads_only_specs_of_the_kind_bounded(tmp_path: Path) -> None:
    folder = spec_folder(tmp_path)
    (folder / "a.yaml").write_text("cdiVersion: 0.6.0\nkind: 'nvidia.com/gpu'  # toolkit\n")
    (folder / "b.json").write_text('{"kind": "nvidia.com/gpu", "devices": []}')
    (folder / "c.yaml").write_text("kind: vendor.com/other\n  kind: nvidia.com/gpu\n")  # indented: not top level
    (folder / "d.yml").write_text("kind: nvidia.com/gpu\n")  # the CDI cache reads .json and .yaml only
    (folder / "e.json").write_text("{not json kind: nvidia.com/gpu")
    (folder / "f.json").write_text(json.dumps({"kind": "nvidia.com/gpu", "pad": "x" * (1 << 20)}))  # too big
    os.mkfifo(folder / "g.json")  # never waited on
    (folder / "ours.json").write_text('{"kind": "nvidia.com/gpu"}')
    found = conflicts(str(folder / "ours.json"), spec_dirs=())
    assert [c.other for c in found] == [f"{folder}/a.yaml", f"{folder}/b.json"]
    assert all(c.same_folder for c in found)


def test_watched_inventory_hands_each_new_one_over_from_the_thread_that_took_it(tmp_path: Path, node: SimNode) -> None:
    seen: list[tuple[str | None, str]] = []
    cache = WatchedInventory(
        engine_of(node), listener=lambda inv: seen.append((inv.driver_version, threading.current_thread().name))
    )
    assert cache.refresh() is False
    assert seen == []
    (node.proc_root / "driver" / "nvidia" / "version").unlink()  # the driver is unloaded
    done = threading.Thread(target=cache.refresh, name="refresher")
    done.start()
    done.join()
    assert seen == [(None, "refresher")]


def test_the_keeper_thread_notices_the_driver_going_and_removes_the_spec(tmp_path: Path, node: SimNode) -> None:
    path = spec_folder(tmp_path) / "nri-gpu.json"
    config = CdiConfig(spec=str(path), hook_path="/opt/nri-gpu/bin/nri-gpu-hook", allow_untrusted_hook=True)
    kept = keeper_for(config, engine_of(node), "")
    assert kept is not None
    cache = WatchedInventory(engine_of(node), listener=kept.changed)
    kept.changed(cache.current)
    kept.start(cache, interval=0.05)
    assert _eventually(path.exists)
    spec = json.loads(path.read_text())
    assert spec["kind"] == "nvidia.com/gpu"
    assert spec["containerEdits"]["hooks"][0]["path"] == "/opt/nri-gpu/bin/nri-gpu-hook"
    assert "/libcuda.so.550.163.01" in path.read_text()
    (node.proc_root / "driver" / "nvidia" / "version").unlink()  # no request comes: the keeper checks itself
    assert _eventually(lambda: not path.exists())


def test_the_keeper_checks_the_compiled_hook_it_names(
    tmp_path: Path, node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    """``[cdi] hook_path`` is checked as ``cdi generate`` checks ``--hook-path``
    (``check_hook``): root's compiled hook is written into the spec, anything else refused."""
    path = spec_folder(tmp_path) / "nri-gpu.json"
    inventory = discover(engine_of(node))
    hook = tmp_path / "bin" / "nri-gpu-hook"
    hook.parent.mkdir()
    shutil.copyfile(NRI_GPU_HOOK, hook)
    hook.chmod(0o755)
    kept = keeper_for(CdiConfig(spec=str(path), hook_path=str(hook)), engine_of(node), "")
    assert kept is not None and kept.sync(inventory) == "written"
    (entry,) = json.loads(path.read_text())["containerEdits"]["hooks"]
    assert entry["args"][:3] == [str(hook), "start-container", "--time-limit"]
    path.unlink()
    hook.chmod(0o775)
    assert kept.sync(inventory) == "refused" and not path.exists()
    assert f"{hook} is writable by its group (mode 0775)" in caplog.text
    script = tmp_path / "bin" / "nri-gpu"
    shutil.copyfile(NRI_GPU, script)  # the console script, where the Python hook used to be
    script.chmod(0o755)
    kept = keeper_for(CdiConfig(spec=str(path), hook_path=str(script)), engine_of(node), "")
    assert kept is not None and kept.sync(inventory) == "refused" and not path.exists()
    assert f"{script} is not nri-gpu's compiled hook (not an ELF file)" in caplog.text


def test_the_keeper_names_the_hook_beside_its_nri_gpu_or_none(
    tmp_path: Path, node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    path = spec_folder(tmp_path) / "nri-gpu.json"
    kept = keeper_for(CdiConfig(spec=str(path), allow_untrusted_hook=True), engine_of(node), NRI_GPU)
    assert kept is not None and kept.sync(discover(engine_of(node))) == "written"
    assert json.loads(path.read_text())["containerEdits"]["hooks"][0]["path"] == os.path.realpath(NRI_GPU_HOOK)
    lone = tmp_path / "bin" / "nri-gpu"
    lone.parent.mkdir()
    shutil.copyfile(NRI_GPU, lone)
    assert keeper_for(CdiConfig(spec=str(path)), engine_of(node), str(lone)) is None
    assert f"CDI spec {path}: not kept: no nri-gpu-hook beside this nri-gpu; set [cdi] hook_path" in caplog.text


def _eventually(check: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_config_and_flag() -> None:
    settings = from_toml('[cdi]\nspec = "/etc/cdi/nri-gpu.json"\n')
    assert settings.cdi == CdiConfig(spec="/etc/cdi/nri-gpu.json")
    args = parser().parse_args(["run", "--cdi-spec", "/var/run/cdi/nri-gpu.json"])
    assert load_config(args, {}).cdi.spec == "/var/run/cdi/nri-gpu.json"
    with pytest.raises(ConfigError, match=re.escape("cdi.spec: 'nri-gpu.json' must be an absolute path")):
        from_toml('[cdi]\nspec = "nri-gpu.json"\n')
    with pytest.raises(ConfigError, match=re.escape("must end in .json")):
        from_toml('[cdi]\nspec = "/etc/cdi/nri-gpu.yaml"\n')
    with pytest.raises(ConfigError, match=re.escape("cdi.spek: unknown setting")):
        from_toml('[cdi]\nspek = "/etc/cdi/x.json"\n')
    with pytest.raises(ConfigError, match=re.escape("cdi.allow_untrusted_hook: expected bool")):
        from_toml("[cdi]\nallow_untrusted_hook = 1\n")


def test_run_refuses_a_relative_cdi_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--cdi-spec", "cdi.json", "--config", os.devnull], environ={}) == 2
    assert "cdi.spec: 'cdi.json' must be an absolute path" in capsys.readouterr().err


def test_generate_names_a_spec_of_the_same_kind_beside_its_output(
    tmp_path: Path, node: SimNode, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = spec_folder(tmp_path)
    (folder / "nvidia.yaml").write_text(THEIRS_YAML)
    argv = ["cdi", "generate", *node.flags(), "--hook-path", "/x/nri-gpu-hook", "--allow-untrusted-hook"]
    assert main([*argv, "--output", str(folder / "nri-gpu.json")]) == 0
    err = capsys.readouterr().err
    assert f"nri-gpu: warning: {folder}/nvidia.yaml also defines CDI kind nvidia.com/gpu in {folder}" in err
    assert (folder / "nri-gpu.json").exists()


def test_a_keeper_that_stepped_aside_writes_once_the_other_spec_is_gone(
    tmp_path: Path, node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    folder = spec_folder(tmp_path)
    (folder / "nvidia.yaml").write_text(THEIRS_YAML)
    path = folder / "nri-gpu.json"
    kept = keeper(path)
    outcomes: list[str] = []
    several = threading.Event()
    sync = kept.sync

    def counted(inventory: Inventory) -> str:
        outcomes.append(sync(inventory))
        if outcomes.count("conflict") >= 3:
            several.set()
        return outcomes[-1]

    kept.sync = counted  # type: ignore[method-assign]
    cache = WatchedInventory(engine_of(node), listener=kept.changed)
    kept.changed(cache.current)
    kept.start(cache, interval=0.05)
    assert several.wait(10), f"the keeper did not look again: {outcomes}"  # three checks stepped aside
    assert caplog.text.count("also defines CDI kind") == 1
    assert not path.exists()
    (folder / "nvidia.yaml").unlink()
    assert _eventually(path.exists)


def test_a_link_to_a_device_beside_the_spec_is_never_opened_for_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cdi generate --output /tmp/x.json looks at every spec beside x.json; a user who
    # can write that folder must not make root open a device (some act on open alone).
    (tmp_path / "evil.json").symlink_to("/dev/null")
    (tmp_path / "other.json").write_text('{"kind": "nvidia.com/gpu"}')
    opened: list[str] = []
    real_open = os.open

    def spy(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if not flags & os.O_PATH and stat.S_ISCHR(os.fstat(fd).st_mode):
            opened.append(path)
        return fd

    monkeypatch.setattr(os, "open", spy)
    found = conflicts(str(tmp_path / "nri-gpu.json"), spec_dirs=())
    assert [c.other for c in found] == [str(tmp_path / "other.json")]
    assert opened == []
