"""The trusted ldconfig's sealed copy, without a container."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from nri_gpu.engine.start import ldconfig
from nri_gpu.engine.start.work import WorkError

LDCONFIG = shutil.which("ldconfig", path="/usr/sbin:/sbin")


def test_a_memfd_the_kernel_refuses_is_a_refusal_naming_ldconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    """``vm.memfd_noexec=2`` refuses every memfd that may be executed, with
    ``MFD_EXEC`` and without: the start fails naming the binary and the step,
    not with a bare errno."""
    if LDCONFIG is None or os.stat(LDCONFIG).st_uid != 0:
        pytest.skip("no root-owned ldconfig here")

    def refused(name: str, flags: int = 0) -> int:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(os, "memfd_create", refused)
    with pytest.raises(WorkError, match=rf"^{LDCONFIG}: copying it for the run: Permission denied"):
        ldconfig.open_trusted(LDCONFIG)
