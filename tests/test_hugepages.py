"""hugepages.py: NumPy's huge-page request off inside small_pages(), as before after it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest

from llmlb_bench import hugepages


def _current() -> bool:
    switch = hugepages._switch()
    assert switch is not None, "this NumPy has no _set_madvise_hugepage: the report would leave the setting alone"
    before = switch(True)
    switch(before)
    return before


@contextmanager
def _numpy_set_to(setting: bool) -> Iterator[None]:
    """NumPy's own setting made ``setting`` for the test, the process's put back after it."""
    switch = hugepages._switch()
    assert switch is not None
    before = switch(setting)
    try:
        yield
    finally:
        switch(before)


@pytest.mark.parametrize("setting", [True, False])
def test_off_inside_and_restored_after(monkeypatch: pytest.MonkeyPatch, setting: bool) -> None:
    monkeypatch.delenv(hugepages.ENV, raising=False)
    with _numpy_set_to(setting):
        with hugepages.small_pages():
            assert _current() is False
        assert _current() is setting
        with pytest.raises(RuntimeError):        # restored on the way out of an error too
            with hugepages.small_pages():
                raise RuntimeError
        assert _current() is setting


def test_the_users_environment_setting_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hugepages.ENV, "1")
    with _numpy_set_to(True), hugepages.small_pages():
        assert _current() is True


def test_a_numpy_without_the_switch_runs_the_block_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hugepages.ENV, raising=False)
    monkeypatch.setattr(hugepages, "_MODULES", ("no_such_module_here",))
    ran = []
    with hugepages.small_pages():
        ran.append(True)
    assert ran == [True]
