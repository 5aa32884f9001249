"""The CDI spec that ``nri-gpu run`` keeps current (``[cdi] spec``, ``--cdi-spec``).

A spec written once names the driver's files by version and goes stale at the
next driver upgrade. ``nri-gpu run`` already notices a new driver (the inventory
is taken again when ``engine.discover.fingerprint`` changes), so it can rewrite
the spec then:

* ``WatchedInventory`` is the plugin's ``InventoryCache``; whichever thread took a
  new inventory (the plugin's refresh thread, or the keeper's own check every
  ``interval`` seconds, which runs even when no container is created) hands it to
  the keeper, and only one refresh runs at a time;
* ``SpecKeeper`` writes in a thread of its own, never on the event loop: the
  newest inventory handed over wins, older ones are skipped.

Each write does what ``cdi generate --output`` does, checks included: the hook
must be one only root can change (``nri_gpu.plugin.cli.hook_install``), and so must the
spec's folder, everything in it and the way to it (a spec there runs its hook as
root); the spec is written to a temporary file in the same folder and renamed
over the name (``nri_gpu.plugin.cli.config_files.Folder``: a link at the name is refused,
never followed). A node whose driver or GPUs are gone gets no spec: the file is
removed, and the log says so. Another spec of kind ``nvidia.com/gpu`` in the same
folder (``nri_gpu.plugin.cli.cdi_conflicts``) would make the CDI cache drop both: then ours is
removed and none written, so that the other one works, and the log names it; one
in the other standard folder is only logged (the later folder wins).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nri_gpu.engine import EngineConfig, EngineError, Inventory, InventoryCache, hook_command, spec_warnings
from nri_gpu.plugin.cli.cdi import capabilities, spec_text
from nri_gpu.plugin.cli.cdi_conflicts import SPEC_DIRS, conflicts
from nri_gpu.plugin.cli.compiled_hook import installed_hook
from nri_gpu.plugin.cli.config_files import FileRefused, Folder
from nri_gpu.plugin.cli.hook_install import check_hook, check_tree
from nri_gpu.plugin.config import CdiConfig

__all__ = ["SpecKeeper", "WatchedInventory", "keeper_for"]

logger = logging.getLogger(__name__)

Render = Callable[[Inventory], str]


class WatchedInventory(InventoryCache):
    """An ``InventoryCache`` that hands every new inventory to ``listener``, in the
    thread that took it; a refresh waits for one running in another thread."""

    def __init__(self, config: EngineConfig, *, listener: Callable[[Inventory], None], **kwargs: Any) -> None:
        self._listener = listener
        self._lock = threading.Lock()
        super().__init__(config, **kwargs)

    def refresh(self, *, force: bool = False) -> bool:
        with self._lock:
            changed = super().refresh(force=force)
        if changed:
            self._listener(self.current)
        return changed


class SpecKeeper:
    """Keeps the spec at ``path`` true to the newest inventory handed to ``changed``.

    ``render(inventory)`` makes the spec's text; ``hook_problems()`` says why the
    hook is not root's alone ([] when it is); with ``allow_untrusted`` those are
    warnings. ``folder_problems(folder)`` checks the spec's folder."""

    def __init__(
        self,
        path: str,
        render: Render,
        hook_problems: Callable[[], list[str]],
        *,
        allow_untrusted: bool = False,
        folder_problems: Callable[[str], list[str]] = check_tree,
        spec_dirs: tuple[str, ...] = SPEC_DIRS,
    ) -> None:
        self.path = Path(path)
        self._render = render
        self._hook_problems = hook_problems
        self._allow_untrusted = allow_untrusted
        self._folder_problems = folder_problems
        self._spec_dirs = spec_dirs
        self._pending: Inventory | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._said: frozenset[str] = frozenset()

    def changed(self, inventory: Inventory) -> None:
        """Hand over a new inventory; returns at once (any thread)."""
        with self._lock:
            self._pending = inventory
        self._wake.set()

    def start(self, cache: InventoryCache, interval: float | None = None) -> threading.Thread:
        """Serve in a daemon thread: write each inventory handed over, and check
        ``cache`` for a new one every ``interval`` seconds (default: the cache's)."""
        every = cache.interval if interval is None else interval
        thread = threading.Thread(target=self._serve, args=(cache, every), name="nri-gpu-cdi-spec", daemon=True)
        thread.start()
        return thread

    def _serve(self, cache: InventoryCache, interval: float) -> None:
        last: Inventory | None = None
        outcome = ""
        while True:
            inventory: Inventory | None = None
            if self._wake.wait(interval):
                self._wake.clear()
                with self._lock:
                    inventory, self._pending = self._pending, None
            else:
                try:
                    cache.refresh()  # a change comes back through ``changed``
                except Exception as exc:
                    logger.error("taking the node's inventory again failed: %s", exc)
                if outcome == "conflict" and not self._wake.is_set():
                    inventory = last  # stepped aside: is the other spec gone?
            if inventory is None:
                continue
            last = inventory
            try:
                outcome = self.sync(inventory)
            except Exception as exc:  # never the end of the keeper
                logger.error("CDI spec %s: %s", self.path, exc, exc_info=exc)

    def sync(self, inventory: Inventory) -> str:
        """Make the file match ``inventory``; what was done: "written", "unchanged",
        "removed", "absent" (no GPUs, no file), "conflict", "refused" or "failed"."""
        folder, name = str(self.path.parent), self.path.name
        problems = self._folder_problems(folder)
        if problems:
            logger.error(
                "CDI spec %s: not written: users other than root can change its folder, and the spec's hook "
                "runs as root: %s",
                self.path,
                "; ".join(problems),
            )
            return "refused"
        if not inventory.gpus:
            why = "no NVIDIA driver" if inventory.driver_version is None else "no GPU"
            return self._remove(f"{why} on this node (see `nri-gpu info`)")
        found = conflicts(str(self.path), spec_dirs=self._spec_dirs)
        # Said once while they last: a keeper that stepped aside looks again at every check.
        # Keyed by the other file, not the message (which may vary between checks).
        said, self._said = self._said, frozenset(f"{c.other}|{c.same_folder}" for c in found)
        for conflict in found:
            if f"{conflict.other}|{conflict.same_folder}" not in said:
                level = logging.ERROR if conflict.same_folder else logging.WARNING
                logger.log(level, "CDI spec %s: %s", self.path, conflict.message)
        same = [c for c in found if c.same_folder]
        if same:
            why = (
                f"another spec of the same kind is in {folder}; remove it or set [cdi] spec to a path in another folder"
            )
            outcome = self._remove(why, quiet=not self._said - said)
            return "conflict" if outcome in ("removed", "absent") else outcome
        problems = self._hook_problems()
        if problems and not self._allow_untrusted:
            logger.error(
                "CDI spec %s: not written: its hook runs as root at every GPU container start, and users other "
                "than root can change what it runs: %s",
                self.path,
                "; ".join(problems),
            )
            return "refused"
        for problem in problems:
            logger.warning("CDI spec %s: allow_untrusted_hook: %s (use this spec for tests only)", self.path, problem)
        try:
            text = self._render(inventory).encode()
        except (EngineError, ValueError) as exc:
            logger.error("CDI spec %s: cannot be made: %s", self.path, exc)
            return "failed"
        try:
            with Folder(self.path.parent, create=True) as spec_folder:
                old = spec_folder.read(name, if_link="remove the link; nri-gpu writes the spec as a regular file")
                if old is not None and old[0] == text:
                    return "unchanged"
                spec_folder.write(name, text)
        except FileRefused as exc:
            logger.error("CDI spec %s: not written: %s", self.path, exc)
            return "failed"
        except OSError as exc:
            logger.error("CDI spec %s: not written: %s", self.path, exc.strerror or exc)
            return "failed"
        logger.info(
            "CDI spec %s written: driver %s, %d GPU(s)", self.path, inventory.driver_version, len(inventory.gpus)
        )
        return "written"

    def _remove(self, why: str, *, quiet: bool = False) -> str:
        try:
            os.lstat(self.path)
        except FileNotFoundError:
            logger.log(logging.DEBUG if quiet else logging.INFO, "CDI spec %s: none kept: %s", self.path, why)
            return "absent"
        except OSError as exc:
            logger.error("CDI spec %s: %s", self.path, exc.strerror)
            return "failed"
        try:
            with Folder(self.path.parent) as spec_folder:
                spec_folder.remove(self.path.name)
        except (FileRefused, OSError) as exc:
            logger.error("CDI spec %s: cannot remove it (%s): %s", self.path, why, exc)
            return "failed"
        logger.warning("CDI spec %s removed: %s", self.path, why)
        return "removed"


def keeper_for(config: CdiConfig, engine: EngineConfig, argv0: str) -> SpecKeeper | None:
    """The keeper ``[cdi]`` asks for, with the hook of ``cdi generate``; None (logged)
    when the spec cannot be made at all."""
    hook_path = config.hook_path or installed_hook(argv0)
    if hook_path is None:
        logger.error("CDI spec %s: not kept: no nri-gpu-hook beside this nri-gpu; set [cdi] hook_path", config.spec)
        return None
    try:
        caps = capabilities(None, engine)
        hook = hook_command(hook_path)
    except (EngineError, ValueError) as exc:
        logger.error("CDI spec %s: not kept: %s", config.spec, exc)
        return None

    def render(inventory: Inventory) -> str:
        for warning in spec_warnings(inventory):
            logger.warning("CDI spec %s: %s", config.spec, warning)
        return spec_text(inventory, engine, caps, hook)

    return SpecKeeper(
        config.spec,
        render,
        lambda: check_hook(hook_path),
        allow_untrusted=config.allow_untrusted_hook,
    )
